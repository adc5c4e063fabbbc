"""Several slots asking at once: the structured search never runs one configuration twice at the
same time, and the restart budget counts launches of every slot (simulated trials, no Ray)."""

from __future__ import annotations

import threading
import time
from typing import Any

from rayspec._config import load_config
from rayspec._types import Candidate
from rayspec._types import TrialResult
from rayspec.search import canonical_key
from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study
from tests.helpers import TWIN_EXPERIMENT


class _Watched:
    """SimulatedTrials that hold each trial a moment (so slots overlap) and note what runs."""

    def __init__(self) -> None:
        self._sim = SimulatedTrials()
        self._lock = threading.Lock()
        self.running: dict[int, str] = {}
        self.twice: list[tuple[int, str]] = []
        self.peak = 0
        self.launched = 0

    def __call__(self, cfg: Any, number: int, candidate: Candidate, **kw: Any) -> TrialResult:
        key = canonical_key(candidate)
        with self._lock:
            if key in self.running.values():
                self.twice.append((number, key))
            self.running[number] = key
            self.peak = max(self.peak, len(self.running))
            self.launched += 1
        try:
            time.sleep(0.3)  # long enough that every slot fills, even on a busy machine
            return self._sim(cfg, number, candidate, **kw)
        finally:
            with self._lock:
                del self.running[number]


def test_four_slots_never_run_one_configuration_twice_and_share_one_budget(tmp_path) -> None:
    cfg = load_config(TWIN_EXPERIMENT, [
        f"output.dir={tmp_path}", "study.max_restarts=20", "bench.repeats=3",
        "bench.max_tokens=100",
    ])  # fmt: skip
    trials = _Watched()
    outcome = run_study(cfg, trial_fn=trials, slots=4, printer=lambda _line: None)
    assert trials.peak == 4  # the slots were used at once
    assert trials.twice == []
    # One budget across the slots: never more launches than it allows, however many ran at once.
    assert outcome.restarts == trials.launched <= 20
    assert outcome.restarts == 20 or outcome.stopped.startswith("converged")


def test_the_slot_count_may_change_while_the_study_runs(tmp_path) -> None:
    """A function for ``slots`` (a cluster whose nodes come and go) is asked again: one slot,
    then three."""
    cfg = load_config(TWIN_EXPERIMENT, [
        f"output.dir={tmp_path}", "study.max_restarts=12", "bench.repeats=3",
        "bench.max_tokens=100",
    ])  # fmt: skip
    trials = _Watched()
    asked = {"n": 0}

    def slots() -> int:
        asked["n"] += 1
        return 1 if trials.launched < 4 else 3

    outcome = run_study(cfg, trial_fn=trials, slots=slots, printer=lambda _line: None)
    assert asked["n"] > 1 and trials.peak == 3 and trials.twice == []
    assert outcome.restarts == trials.launched <= 12
