"""Trials asked while their configuration runs in another slot.

Optuna's random and grid samplers know nothing of the driver's slots: with several trials at
once they draw a configuration that is running now (the grid re-offers its running points once
every other point is taken; see ``GridSampler._get_unvisited_grid_ids``). Such a trial is held:
it takes no slot and starts no server, and when the running trial ends it goes on as if it had
been asked just after (its result reused, at no cost, or launched when there is none to reuse).
"""

from __future__ import annotations

from rayspec.search import TrialHandle

__all__ = ["HeldTrials"]


class HeldTrials:
    """Held trials, each waiting for the running trial of its configuration."""

    def __init__(self) -> None:
        self._waiting: dict[int, list[TrialHandle]] = {}  # running trial -> trials held on it
        self._ready: list[TrialHandle] = []  # their trial ended: to go on, oldest first

    def __len__(self) -> int:
        return len(self._ready) + sum(len(v) for v in self._waiting.values())

    def hold(self, trial: TrialHandle, running: int) -> None:
        self._waiting.setdefault(running, []).append(trial)

    def release(self, ended: int) -> None:
        """``ended`` has its result: the trials held on it may go on."""
        self._ready.extend(self._waiting.pop(ended, []))

    def next_ready(self) -> TrialHandle | None:
        """The oldest held trial whose running trial has ended (None: none)."""
        return self._ready.pop(0) if self._ready else None

    def drain(self) -> list[TrialHandle]:
        """Take every held trial, ready or not (the study is ending)."""
        out = self._ready + [t for group in self._waiting.values() for t in group]
        self._ready, self._waiting = [], {}
        return out
