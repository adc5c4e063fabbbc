"""A resume whose measurements could not be compared with the stored ones is refused before Ray
starts, in one line naming what changed; what a resume may change is accepted; a study kept
without the fingerprint adopts the experiment's with one warning."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest

from rayspec._config import load_config
from rayspec._exceptions import ConfigError
from rayspec.search import SearchSpace
from rayspec.search import open_study
from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study
from rayspec.tune._preflight import preflight
from tests.helpers import write_experiment

_DOC: dict[str, Any] = {
    "study": {"name": "fp", "max_restarts": 2},
    "cluster": {"include_dashboard": False},
    "server": {"engine": "twin"},
    "search": {"speculative": {"modes": ["off", "EAGLE3"], "num_steps": [1, 2],
                               "eagle_topk": [1]}},
    "bench": {"warmup": 0, "repeats": 1, "max_repeats": 1, "max_tokens": 150},
}  # fmt: skip


@pytest.fixture
def stored(tmp_path) -> str:
    path = write_experiment(str(tmp_path), {**_DOC, "output": {"dir": str(tmp_path / "runs")}})
    run_study(load_config(path), trial_fn=SimulatedTrials(), printer=lambda _line: None)
    return path


def _refusal(path: str, *overrides: str) -> str:
    cfg = load_config(path, list(overrides))
    with pytest.raises(ConfigError) as exc:
        preflight(cfg, launching=False)
    return str(exc.value)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        # the cases, each accepted before and giving a wrong result
        (["server.twin.profile=h200-nvlink-tp8-dense"], "server.twin.profile"),
        (["server.model_path=/models/other"], "server.model_path"),
        (["bench.max_tokens=400", "bench.concurrency=4"], "bench.concurrency, bench.max_tokens"),
        (["bench.prompts=mixed"], "bench.prompts"),
        (["study.objective=goodput", "study.slo.ttft_p99_ms=500"], "study.objective, study.slo"),
        (["bench.max_tokens=60"], "bench.max_tokens"),
        (["bench.check_outputs=false"], "bench.check_outputs"),
        (["server.env.HF_TOKEN=s3cr3t"], "server.env"),
    ],
)
def test_a_changed_measurement_is_refused_naming_what_changed(
    stored: str, overrides: list[str], named: str
) -> None:
    message = _refusal(stored, *overrides)
    assert message.startswith(f"{named}: study 'fp' in "), message
    assert "\n" not in message and "another study.name (or output.dir)" in message
    assert "s3cr3t" not in message  # a secret-looking value is held by its hash only


def test_the_refusal_says_what_the_value_was(stored: str) -> None:
    assert "bench.max_tokens (was 150, now 60)" in _refusal(stored, "bench.max_tokens=60")


def test_what_a_resume_may_change_is_accepted(stored: str, tmp_path) -> None:
    same_prompts = tmp_path / "prompts-copy.jsonl"
    shutil.copy(os.path.join(os.path.dirname(__file__), "..", "..", "rayspec", "bench",
                             "prompts", "default.jsonl"), same_prompts)  # fmt: skip
    cfg = load_config(stored, [
        "study.max_restarts=9", "server.port=31234", "bench.read_timeout_s=5",
        "server.startup_timeout_s=90", "study.sampler=tpe", "cluster.max_concurrent_trials=2",
        f"bench.prompts={same_prompts}",  # the same content under another name
    ])  # fmt: skip
    assert preflight(cfg, launching=False) == []
    outcome = run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None)
    assert outcome.resumed_from == 2 and outcome.ran > 0


def test_the_command_line_refuses_before_ray_with_exit_2(stored: str, capsys, monkeypatch) -> None:
    from rayspec.tune.__main__ import main

    def no_ray(*_a: object, **_k: object) -> None:
        raise AssertionError("Ray was started for a refused resume")

    monkeypatch.setattr("rayspec.tune._cluster.connect", no_ray)
    monkeypatch.setattr("ray.init", no_ray)
    journal = os.path.join(os.path.dirname(stored), "runs", "fp", "optuna.journal")
    before = open(journal, "rb").read()
    assert main([stored, "bench.max_tokens=60"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: bench.max_tokens: study 'fp'"), err
    assert open(journal, "rb").read() == before  # nothing written


def test_a_study_kept_without_a_fingerprint_adopts_the_experiments(tmp_path, monkeypatch) -> None:
    import rayspec.search._study as study_module
    from rayspec.search._resume import check_resumable

    path = write_experiment(str(tmp_path), {**_DOC, "output": {"dir": str(tmp_path / "runs")}})
    with monkeypatch.context() as old:  # a study as an older rayspec kept it
        old.setattr(study_module, "ATTR_MEASURED_WITH", "not_the_fingerprint")
        run_study(load_config(path), trial_fn=SimulatedTrials(), printer=lambda _line: None)
    cfg = load_config(path, ["study.max_restarts=3"])
    space = SearchSpace.from_config(cfg.search)
    warnings = check_resumable(cfg, space)
    assert len(warnings) == 1 and "adopts this experiment's" in warnings[0], warnings
    open_study(cfg, space)  # adopted: kept from now on
    assert check_resumable(cfg, space) == []
    assert "bench.max_tokens" in _refusal(path, "bench.max_tokens=60")


def test_the_docs_say_what_a_resume_keeps_and_what_it_may_change() -> None:
    """docs/config.md, *Resuming a study*: its paragraph of what the study keeps
    (``measured_with``) names every measured key and every key a resume may change."""
    from rayspec.search._resume import RESUME_MAY_CHANGE
    from rayspec.search._resume import measurement_fingerprint
    from tests.helpers import REPO
    from tests.helpers import TWIN_EXPERIMENT

    with open(os.path.join(REPO, "docs", "config.md"), encoding="utf-8") as fh:
        doc = fh.read()
    section = doc[doc.index("\n## Resuming a study\n") + 1 :]
    end = section.find("\n## ")  # the next heading, if any
    section = section if end < 0 else section[:end]
    (section,) = [p for p in section.split("\n\n") if "`measured_with`" in p]
    assert [p for p in RESUME_MAY_CHANGE if f"`{p}`" not in section] == []
    keys = {k.split("#")[0] for k in measurement_fingerprint(load_config(TWIN_EXPERIMENT))}
    shown = {k for k in keys if f"`{k}`" in section or f"`{k.split('.')[-1]}`" in section}
    shown |= {k for k in keys if k.startswith("bench.ladder.") and "`ladder.*`" in section}
    shown |= {"bench.prompts", "server.twin.profile"}  # "the prompts' file", "profile file"
    assert sorted(keys - shown) == []
