"""What a new user meets first: the command line's help and errors, a finished study resumed,
and commands printed so that they run as printed (no activated venv)."""

from __future__ import annotations

import os
import shlex
import sys

import pytest

from rayspec._config import load_config
from rayspec._plural import plural
from rayspec._types import Candidate
from rayspec._types import SpecSettings
from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study
from rayspec.tune.__main__ import installed_command
from rayspec.tune.__main__ import main
from rayspec.tune._cluster import ClusterHandle
from tests.helpers import free_port_block
from tests.helpers import twin_doc
from tests.helpers import write_experiment


def test_no_arguments_say_what_is_expected(capsys) -> None:
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "error: no experiment file given: name one, e.g. experiments/eagle3-twin.yaml" in err
    assert "required: experiment, key=value" not in err
    assert "EXPERIMENT.yaml [MORE.yaml ...] [dotted.key=value ...]" in err  # the usage line


def test_help_shows_that_several_files_are_allowed(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "EXPERIMENT.yaml [MORE.yaml ...]" in out
    assert "experiments/eagle3.yaml clusters/onprem-8gpu.yaml" in out
    # The examples name this interpreter, so they run as printed without an activated venv.
    example = next(line for line in out.splitlines() if "eagle3-twin.yaml" in line).split()
    assert example[1:3] == ["-m", "rayspec.tune"]
    assert example[0] == "python" or os.path.exists(example[0])


def test_print_config_shows_the_resolved_storage(tmp_path, capsys) -> None:
    path = write_experiment(str(tmp_path), twin_doc(str(tmp_path / "runs")))
    assert main([path, "--print-config"]) == 0
    out = capsys.readouterr().out
    assert f"storage: {tmp_path / 'runs' / 't' / 'optuna.journal'}" in out
    assert "storage: ''" not in out


def test_installed_commands_run_as_printed() -> None:
    dashboard = installed_command("optuna-dashboard")
    beside = os.path.join(os.path.dirname(sys.executable), "optuna-dashboard")
    if os.path.exists(beside):
        assert os.path.samefile(dashboard, beside)
    else:
        assert dashboard == "optuna-dashboard"


def test_counted_words_agree() -> None:
    assert plural(1, "trial") == "1 trial" and plural(2, "trial") == "2 trials"
    assert plural(0, "run") == "0 runs" and plural(8.0, "GPU") == "8 GPUs"
    assert SpecSettings("EAGLE3", 1, 1, 2).label() == "EAGLE3 1 step, topk 1, 2 draft tokens"
    assert Candidate(spec=SpecSettings("EAGLE3", 3, 4, 8)).label().startswith("EAGLE3 3 steps")
    handle = ClusterHandle(address="local", local=True, gpus=8, slots=1, dashboard_url="")
    assert handle.describe() == "local Ray cluster: 8 GPUs, 1 trial at once"


def _finished_study(tmp_path, restarts: int, bench: dict | None = None) -> str:
    doc = twin_doc(str(tmp_path / "runs"), study={"name": "t", "max_restarts": restarts},
                   bench=bench or {"repeats": 2, "max_tokens": 40})  # fmt: skip
    doc["study"].pop("n_trials")
    path = write_experiment(str(tmp_path), doc)
    run_study(load_config(path), trial_fn=SimulatedTrials(), printer=lambda _line: None)
    return path


def test_a_finished_study_says_so_without_starting_ray(tmp_path, capsys, monkeypatch) -> None:
    path = _finished_study(tmp_path, restarts=2)

    def no_ray(*_a: object, **_k: object) -> None:
        raise AssertionError("Ray was started for a study with nothing to run")

    monkeypatch.setattr("rayspec.tune._cluster.connect", no_ray)
    monkeypatch.setattr("ray.init", no_ray)
    assert main([path, f"server.port={free_port_block()}"]) == 0
    out = capsys.readouterr().out
    assert (
        "nothing left to run: restart budget spent (2 server launches); to go on, raise the "
        "budget (e.g. study.max_restarts=12)" in out
    )
    assert "study t: 2 server restarts, 2 trials" in out
    assert "| trials | config |" in out and "best: " in out
    # The printed optuna-dashboard line runs as printed.
    line = next(line for line in out.splitlines() if "optuna-dashboard" in line)
    argv = shlex.split(line.split("study:", 1)[1])
    assert argv[0] == "optuna-dashboard" or os.path.exists(argv[0])
    assert os.path.exists(argv[1])


def test_the_end_of_a_study_says_what_each_change_bought(tmp_path, capsys, monkeypatch) -> None:
    # The baseline and enqueued[0], each started once. The runs are long enough for one start
    # of the speculative configuration to leave the baseline floor even at 3x the prior's start
    # noise (the pick rule before any repeated start); with 2 runs of 40 tokens, or 200, it cannot.
    bench = {"repeats": 5, "max_tokens": 500}  # the field protocol
    path = _finished_study(tmp_path, restarts=2, bench=bench)
    monkeypatch.setattr("rayspec.tune._cluster.connect", lambda *_a, **_k: None)
    assert main([path, f"server.port={free_port_block()}"]) == 0
    out = capsys.readouterr().out.splitlines()
    at = out.index("what each change bought, against the baseline:")
    assert out[at + 1] == (
        "  NCCL alone (speculation off): not measured (the study has no such trial)"
    )
    spec, joint = out[at + 2], out[at + 3]  # enqueued[0]: speculation on the default NCCL
    assert spec.startswith("  speculation on top (the baseline's NCCL): ")
    assert joint.startswith("  the joint pick: ")
    for line in (spec, joint):
        assert "x the baseline (95 %: " in line and line.endswith("NCCL default")
        assert "trial 1: EAGLE3" in line
