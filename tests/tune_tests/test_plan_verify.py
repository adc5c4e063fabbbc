"""The plan's verification on simulated twin starts (no Ray): after the search, the per-load
plan itself runs at every load, lands in Parquet with role ``plan`` and its tiers, spends a
restart kept for it, and a failure is a row, not the study's."""

from __future__ import annotations

import json
import os

from rayspec._config import load_config
from rayspec._exceptions import FailureReason
from rayspec.results import PLAN_PARAM
from rayspec.results import PLAN_ROLE
from rayspec.store import ParquetTrialStore
from rayspec.store import StudyFolder
from rayspec.testing import SimulatedTrials
from rayspec.testing import _simtrial
from rayspec.tune import run_study
from rayspec.twin._simulate import SimulatedServer
from rayspec.twin._simulate import SimulatedStartupError
from tests.helpers import TWIN_EXPERIMENT

PROTOCOL = [
    "bench.warmup=1", "bench.repeats=2", "bench.max_repeats=3", "bench.max_tokens=40",
    "bench.ladder.concurrency=[1,8]", "study.max_restarts=4",
]  # fmt: skip


def _cfg(tmp_path, *extra: str):
    return load_config(TWIN_EXPERIMENT, [f"output.dir={tmp_path}", *PROTOCOL, *extra])


def _rows(cfg) -> list[dict]:
    return ParquetTrialStore(cfg.out_dir, ["c8"]).load_trials().to_pylist()


def test_the_plan_runs_after_the_search_and_lands_in_parquet(tmp_path) -> None:
    cfg = _cfg(tmp_path)
    lines: list[str] = []
    outcome = run_study(cfg, trial_fn=SimulatedTrials(), printer=lines.append, write_report=True)
    rows = _rows(cfg)
    plans = [r for r in rows if r["role"] == PLAN_ROLE]
    assert len(plans) == 1, [r["role"] for r in rows]
    plan = plans[0]
    assert plan["trial"] == max(r["trial"] for r in rows)  # after the search
    assert plan["state"] == "COMPLETE" and plan["restart"] == 4.0  # the kept restart
    tiers = json.loads(json.loads(plan["params"])[PLAN_PARAM])["tiers"]
    assert set(tiers) == {"1", "8"}
    assert "--speculative-adaptive" in json.loads(plan["command"])
    assert plan["tok_s_mean"] > 0 and plan["c8__tok_s_mean"] > 0  # measured at every load
    assert outcome.report.best is not None and outcome.report.best.role != PLAN_ROLE
    assert "kept for the plan's verification" in outcome.stopped
    assert not plan["alarm"]  # its steps follow the load: no acceptance alarm for it
    with open(f"{cfg.out_dir}/report.md", encoding="utf-8") as fh:
        text = fh.read()
    assert "## The per-load plan" in text and "| 8 |" in text
    # A resume with the budget spent runs nothing again.
    again = run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None)
    assert again.ran == 0 and len(_rows(cfg)) == len(rows)
    # A lost trial file is rebuilt from the journal as the plan's (not as the baseline).
    os.remove(StudyFolder(cfg.out_dir).trial_file(plan["trial"]))
    run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None)
    rebuilt = next(r for r in _rows(cfg) if r["trial"] == plan["trial"])
    assert rebuilt["role"] == PLAN_ROLE and rebuilt["params"] == plan["params"]
    assert rebuilt["candidate"] == plan["candidate"]


class _NoAdaptive(SimulatedServer):
    def __init__(self, argv, env, profile=None) -> None:  # type: ignore[no-untyped-def]
        if "--speculative-adaptive" in argv:
            raise SimulatedStartupError(FailureReason.STARTUP_CRASH, "no adaptive here")
        super().__init__(argv, env, profile)


def test_a_failed_verification_is_recorded_not_fatal(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(_simtrial, "SimulatedServer", _NoAdaptive)
    cfg = _cfg(tmp_path)
    outcome = run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None)
    plans = [r for r in _rows(cfg) if r["role"] == PLAN_ROLE]
    assert [p["state"] for p in plans] == ["FAIL"] and plans[0]["failure"] == "startup_crash"
    assert outcome.report.best is not None


def test_verify_plan_0_keeps_nothing_and_runs_no_plan(tmp_path) -> None:
    cfg = _cfg(tmp_path, "study.verify_plan=0")
    outcome = run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None)
    assert not [r for r in _rows(cfg) if r["role"] == PLAN_ROLE]
    assert outcome.restarts == 4 and "kept" not in outcome.stopped


def test_a_verification_interrupted_by_a_killed_driver_runs_again_on_resume(tmp_path) -> None:
    """The driver dies while the plan runs: on resume the trial is failed (interrupted, its
    row the plan's, nothing queued as a configuration of the space) and the plan runs again."""
    import pytest

    def killed_at_the_plan(cfg, number, candidate, **kwargs):  # type: ignore[no-untyped-def]
        if candidate.adaptive_tiers:
            raise KeyboardInterrupt
        return SimulatedTrials()(cfg, number, candidate, **kwargs)

    cfg = _cfg(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        run_study(cfg, trial_fn=killed_at_the_plan, printer=lambda _line: None)
    assert not [r for r in _rows(cfg) if r["role"] == PLAN_ROLE]
    lines: list[str] = []
    run_study(cfg, trial_fn=SimulatedTrials(), printer=lines.append)
    plans = [r for r in _rows(cfg) if r["role"] == PLAN_ROLE]
    assert [(p["state"], p["failure"]) for p in plans] == [
        ("FAIL", "interrupted"), ("COMPLETE", None),
    ]  # fmt: skip
    assert plans[0]["params"] == plans[1]["params"]
    assert any("the plan's verification) was interrupted" in line for line in lines)
    assert len(_rows(cfg)) == plans[1]["trial"] + 1  # nothing else ran after the search


def test_a_plan_budget_that_leaves_the_search_nothing_is_refused_in_one_line(tmp_path) -> None:
    """``study.verify_plan=5`` with a budget of 3 ran no trial at all ("restart budget spent (3
    server launches, 5 kept for the plan's verification)"): refused before anything starts."""
    import pytest

    from rayspec._exceptions import ConfigError
    from rayspec.tune._preflight import preflight

    cfg = _cfg(tmp_path, "study.verify_plan=5", "study.max_restarts=3")
    with pytest.raises(ConfigError) as exc:
        preflight(cfg, launching=False)
    assert str(exc.value).startswith("study.verify_plan: 5 server starts kept for the plan's")
    assert "raise study.max_restarts to 7 or more" in str(exc.value)
    assert "\n" not in str(exc.value)
    preflight(_cfg(tmp_path, "study.verify_plan=5", "study.max_restarts=7"), launching=False)
