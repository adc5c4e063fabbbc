"""Simulated trials that take time, so several slots of :func:`rayspec.tune.run_study` overlap.

:class:`SlottedTrials` wraps :class:`~rayspec.testing.SimulatedTrials`: each trial is held a
moment after its simulation (a fixed ``hold_s`` plus ``per_bench_s`` per simulated benchmark
second, so longer benchmarks end later, as on a cluster), and it notes what runs: the peak
number of trials at once, launches, and any configuration that ran twice at the same time.
No Ray. Used by the parallel-search tests and ``benchmarks/search_efficiency.py --slots``.

On a cluster a trial lasts minutes and the driver decides in milliseconds; here a hold of
0.3 s is shorter than the driver's own work on a loaded machine, so how many trials overlap
would depend on the machine. ``overlap`` takes that out: each trial also lasts until
``overlap - 1`` later trials have started, or until no trial has started for ``idle_s``
(the driver is waiting for a result), whichever is first.

Example::

    trials = SlottedTrials(hold_s=0.3, overlap=4)
    run_study(cfg, trial_fn=trials, slots=4, printer=lambda _line: None)
    assert trials.twice == []
"""

from __future__ import annotations

import threading
import time
from typing import Any

from rayspec._config import ExperimentConfig
from rayspec._types import Candidate
from rayspec._types import TrialResult
from rayspec.search import canonical_key
from rayspec.testing._simtrial import SimulatedTrials

__all__ = ["SlottedTrials"]


class SlottedTrials:
    """A ``trial_fn`` of simulated trials held long enough that slots run at once.

    Args:
        hold_s: seconds each trial is held after its simulation.
        per_bench_s: further seconds held per simulated benchmark second of the trial.
        overlap: each trial also lasts until this many trials (itself included) have started
            since it did, so the slots overlap however slow the machine is (1: time only).
        idle_s: ... or until no trial has started for this long (the driver waits on results).

    Attributes:
        running: trial number to configuration key, for the trials running now.
        twice: (trial, key) of each trial started while its configuration ran in another slot.
        peak: most trials that ran at once.
        launched: trials started.
    """

    def __init__(
        self, hold_s: float = 0.3, per_bench_s: float = 0.0, overlap: int = 1, idle_s: float = 1.0
    ) -> None:
        self._sim = SimulatedTrials()
        self._lock = threading.Lock()
        self._started = threading.Condition(self._lock)
        self._last_start = time.monotonic()
        self.hold_s = hold_s
        self.per_bench_s = per_bench_s
        self.overlap = max(1, overlap)
        self.idle_s = idle_s
        self.running: dict[int, str] = {}
        self.twice: list[tuple[int, str]] = []
        self.peak = 0
        self.launched = 0

    def __call__(
        self, cfg: ExperimentConfig, number: int, candidate: Candidate, **kw: Any
    ) -> TrialResult:
        key = canonical_key(candidate)
        with self._lock:
            if key in self.running.values():
                self.twice.append((number, key))
            self.running[number] = key
            self.peak = max(self.peak, len(self.running))
            self.launched += 1
            mine = self.launched
            self._last_start = time.monotonic()
            self._started.notify_all()
        try:
            result = self._sim(cfg, number, candidate, **kw)
            bench_s = result.metrics.get("bench_s", 0.0) or 0.0
            time.sleep(self.hold_s + self.per_bench_s * bench_s)
            self._wait_for_later_starts(mine)
            return result
        finally:
            with self._lock:
                del self.running[number]

    def _wait_for_later_starts(self, mine: int) -> None:
        with self._started:
            while self.launched < mine + self.overlap - 1:
                idle = time.monotonic() - self._last_start
                if idle >= self.idle_s:
                    return
                self._started.wait(self.idle_s - idle)
