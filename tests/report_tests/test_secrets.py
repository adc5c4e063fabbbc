"""A secret in the server's environment (``server.env.HF_TOKEN: ${oc.env:HF_TOKEN}``) reaches
the server and no file of the study: every file the study writes is read back (Parquet cell by
cell, the rest as bytes), and ``best.sh`` takes it from the environment it runs in."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from importlib import resources

import pyarrow.parquet as pq
import pytest

from rayspec._config import load_config
from rayspec._exceptions import ConfigError
from rayspec._secrets import SECRET_VALUE
from rayspec._secrets import is_secret
from rayspec.report import write_report
from rayspec.results import write_best
from rayspec.store import StudyFolder
from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study
from rayspec.twin._profile import _PROFILE_DIR
from rayspec.twin._profile import _PROFILE_PACKAGE
from tests.helpers import TWIN_EXPERIMENT

TOKEN = "hf_tHiSiSaSeCrEtT0kEn"
API_KEY = "sk-An0therS3cretValue"


def _study(tmp_path, monkeypatch) -> tuple[object, str]:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("MY_API_KEY", API_KEY)
    cfg = load_config(TWIN_EXPERIMENT, [
        f"output.dir={tmp_path / 'runs'}", "study.max_restarts=3", "bench.repeats=2",
        "bench.max_tokens=40", "cluster.include_dashboard=false",
        "server.env.HF_TOKEN=${oc.env:HF_TOKEN}", "server.env.MY_API_KEY=${oc.env:MY_API_KEY}",
        "server.env.PLAIN_SETTING=visible-value",
    ])  # fmt: skip
    assert cfg.server.env["HF_TOKEN"] == TOKEN  # the interpolation is live
    outcome = run_study(
        cfg, trial_fn=SimulatedTrials(), printer=lambda _l: None, write_report=True
    )
    write_best(cfg, outcome.report)
    return cfg, cfg.out_dir


def _texts(root: str) -> dict[str, str]:
    """Every file under ``root`` as text: a Parquet file's every cell, any other its bytes."""
    out = {}
    for here, _, names in os.walk(root):
        for name in names:
            path = os.path.join(here, name)
            if name.endswith(".parquet"):
                out[path] = json.dumps(pq.read_table(path).to_pylist(), default=str)
            else:
                with open(path, "rb") as fh:
                    out[path] = fh.read().decode("utf-8", errors="replace")
    return out


def test_no_file_of_the_study_holds_a_secret(tmp_path, monkeypatch) -> None:
    _, out = _study(tmp_path, monkeypatch)
    texts = _texts(out)
    folder = StudyFolder(out)
    for must in (folder.best_sh, folder.best_twin_sh, folder.best_yaml, folder.report_md,
                 folder.nccl_screen, folder.journal, folder.trial_file(0)):  # fmt: skip
        assert must in texts, must
    for path, text in texts.items():
        assert TOKEN not in text and API_KEY not in text, path
    # The rest of the environment is written as before: the check reads what was written.
    assert (
        "visible-value" in texts[folder.trial_file(0)] and "visible-value" in texts[folder.best_sh]
    )
    env = json.loads(pq.read_table(folder.trial_file(0)).to_pylist()[0]["env"])
    assert env["HF_TOKEN"] == SECRET_VALUE and env["PLAIN_SETTING"] == "visible-value"


def _fake_python(tmp_path) -> str:
    """A ``python`` that prints the secret it was started with, instead of SGLang."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python"
    fake.write_text('#!/bin/sh\necho "server got HF_TOKEN=$HF_TOKEN MY_API_KEY=$MY_API_KEY"\n')
    fake.chmod(0o755)
    return str(bin_dir)


def test_best_sh_reads_each_secret_from_the_environment_and_says_so(tmp_path, monkeypatch):
    _, out = _study(tmp_path, monkeypatch)
    script = StudyFolder(out).best_sh
    text = open(script, encoding="utf-8").read()
    assert "HF_TOKEN, MY_API_KEY: secrets, not written in best.sh" in text
    bin_dir = _fake_python(tmp_path)
    base = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "MODEL_PATH": "m", "DRAFT_MODEL_PATH": "d"}
    ran = subprocess.run(
        ["bash", script], env={**base, "HF_TOKEN": "t1", "MY_API_KEY": "k1"},
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "server got HF_TOKEN=t1 MY_API_KEY=k1"
    missing = subprocess.run(
        ["bash", script], env={**base, "MY_API_KEY": "k1"}, capture_output=True, text=True,
        timeout=30,
    )  # fmt: skip
    assert missing.returncode != 0 and missing.stdout == ""  # the server never started
    assert "set HF_TOKEN in the environment: best.sh does not hold it" in missing.stderr
    assert stat.S_IMODE(os.stat(script).st_mode) == 0o755


def test_a_report_rebuilt_from_the_folder_reads_secrets_at_run_time(tmp_path, monkeypatch):
    _, out = _study(tmp_path, monkeypatch)
    os.remove(StudyFolder(out).best_sh)  # the launch then comes from the pick's stored row
    write_report(out)
    text = open(StudyFolder(out).report_md, encoding="utf-8").read()
    assert ': "${HF_TOKEN:?set HF_TOKEN in the environment' in text
    assert TOKEN not in text and SECRET_VALUE not in text


def test_a_missing_environment_variable_names_the_key_and_the_variable(monkeypatch) -> None:
    monkeypatch.delenv("NO_SUCH_TOKEN", raising=False)
    with pytest.raises(ConfigError) as err:
        load_config(TWIN_EXPERIMENT, ["server.env.HF_TOKEN=${oc.env:NO_SUCH_TOKEN}"])
    message = str(err.value)
    assert message.startswith("server.env.HF_TOKEN: ${oc.env:NO_SUCH_TOKEN}: the environment ")
    assert "NO_SUCH_TOKEN is not set" in message
    assert "eagle3-twin.yaml" not in message  # the override set it, not the file


@pytest.mark.parametrize(
    ("name", "secret"),
    [("HF_TOKEN", True), ("HUGGING_FACE_HUB_TOKEN", True), ("OPENAI_API_KEY", True),
     ("AWS_SECRET_ACCESS_KEY", True), ("DB_PASSWORD", True), ("GOOGLE_APPLICATION_CREDENTIALS",
     True), ("hf_token", True), ("NCCL_PROTO", False), ("CUDA_VISIBLE_DEVICES", False),
     ("SGLANG_ENABLE_TORCH_COMPILE", False), ("TOKENIZERS_PARALLELISM", False),
     ("MONKEY_PATCH", False)],
)  # fmt: skip
def test_which_names_are_secrets(name: str, secret: bool) -> None:
    assert is_secret(name) is secret


def test_best_twin_sh_names_a_profile_file_by_its_absolute_path(tmp_path, monkeypatch) -> None:
    ref = resources.files(_PROFILE_PACKAGE).joinpath(_PROFILE_DIR, "kimi-k2.5-tp8-pcie.yaml")
    (tmp_path / "my-profile.yaml").write_text(ref.read_text(encoding="utf-8"))
    monkeypatch.chdir(tmp_path)
    cfg = load_config(TWIN_EXPERIMENT, [
        "output.dir=runs", "study.max_restarts=2", "bench.repeats=2", "bench.max_tokens=40",
        "cluster.include_dashboard=false", "server.twin.profile=my-profile.yaml",
    ])  # fmt: skip
    outcome = run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _l: None)
    write_best(cfg, outcome.report)
    text = open(StudyFolder(cfg.out_dir).best_twin_sh, encoding="utf-8").read()
    assert f"--twin-profile {tmp_path / 'my-profile.yaml'}" in text  # runs from any folder
