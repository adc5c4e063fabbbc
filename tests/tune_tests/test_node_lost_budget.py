"""A launch lost with its node costs no restart: its retry runs even when that launch took the
last restart of the budget (simulated trials, no Ray)."""

from __future__ import annotations

import glob
import os
from typing import Any

import pyarrow.parquet as pq

from rayspec._config import ExperimentConfig
from rayspec._config import load_config
from rayspec._exceptions import FailureReason
from rayspec._types import Candidate
from rayspec._types import TrialResult
from rayspec.search import SearchSpace
from rayspec.search import open_study
from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study
from rayspec.tune._trial import failed_result
from tests.helpers import TWIN_EXPERIMENT


class _LosesNodes:
    """SimulatedTrials whose trials numbered in ``lose`` start a server, then lose its node."""

    def __init__(self, lose: set[int]) -> None:
        self._sim = SimulatedTrials()
        self.lose = lose
        self.launched: list[int] = []

    def __call__(self, cfg: Any, number: int, candidate: Candidate, **kw: Any) -> TrialResult:
        self.launched.append(number)
        result = self._sim(cfg, number, candidate, **kw)
        if number not in self.lose:
            return result
        return failed_result(
            number, candidate, FailureReason.NODE_LOST, "the node died (simulated)",
            launch=result.launch, node="10.0.0.9 0123456789ab",
        )  # fmt: skip


def _cfg(tmp_path: Any, budget: int) -> ExperimentConfig:
    return load_config(TWIN_EXPERIMENT, [
        f"output.dir={tmp_path}", f"study.max_restarts={budget}", "bench.warmup=0",
        "bench.repeats=2", "bench.max_repeats=2", "bench.max_tokens=40",
    ])  # fmt: skip


def _rows(cfg: ExperimentConfig) -> dict[int, dict[str, Any]]:
    files = glob.glob(os.path.join(cfg.out_dir, "trials", "*.parquet"))
    rows = [pq.read_table(f).to_pylist()[0] for f in files]
    return {int(r["trial"]): r for r in rows}


def test_the_retry_of_a_lost_launch_runs_when_that_launch_took_the_last_restart(tmp_path) -> None:
    # Baseline, the enqueued configuration, then the search's first pick: lost with its node
    # as the budget's third launch.
    cfg = _cfg(tmp_path, budget=3)
    trials = _LosesNodes(lose={2})
    lines: list[str] = []
    outcome = run_study(cfg, trial_fn=trials, slots=1, printer=lines.append)
    rows = _rows(cfg)
    assert rows[2]["failure"] == "node_lost"
    handle = open_study(cfg, SearchSpace.from_config(cfg.search))
    retries = [t for t in handle.trials() if t.attrs.get("retry_of") == 2]
    assert len(retries) == 1 and retries[0].number in rows, "the retry never ran"
    retry = rows[retries[0].number]
    assert retry["state"] == "COMPLETE" and retry["candidate"] == rows[2]["candidate"]
    # Four servers started, three counted; every trial has its row, nothing left queued.
    assert trials.launched == [0, 1, 2, 3] and outcome.restarts == 3
    assert sorted(rows) == sorted(t.number for t in handle.trials()) and not handle.queued()
    assert any(line.startswith("[not counted] trial 2") for line in lines), lines


def test_a_configuration_that_loses_its_node_twice_is_not_launched_again(tmp_path) -> None:
    """Lost launches cost nothing, so one that takes its node down must not be proposed for
    ever: after its retry is lost too, the search moves on."""
    cfg = _cfg(tmp_path, budget=3)
    trials = _LosesNodes(lose={2, 3})  # the search's first pick, and its retry
    outcome = run_study(cfg, trial_fn=trials, slots=1, printer=lambda _line: None)
    rows = _rows(cfg)
    lost = rows[2]["candidate"]
    assert rows[3]["candidate"] == lost and rows[3]["failure"] == "node_lost"
    assert sorted(n for n, r in rows.items() if r["candidate"] == lost) == [2, 3]
    assert outcome.restarts == 3 and len(trials.launched) == 5
