"""What this invocation may still start: restarts, trials, wall time, and the failures that
stop every later trial too."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rayspec._config import ExperimentConfig
from rayspec._exceptions import FailureReason
from rayspec._plural import plural
from rayspec._types import TrialRecord
from rayspec._types import TrialResult

__all__ = ["Budget", "halts_study"]


class Budget:
    """Restarts, trials and wall time: what this invocation may still start."""

    def __init__(self, cfg: ExperimentConfig, records: Sequence[TrialRecord], told: int) -> None:
        self.max_restarts = cfg.study.max_restarts
        self.n_trials = cfg.study.n_trials
        self.max_wall_s = cfg.study.max_wall_s
        self.restarts = sum(1 for r in records if r.launched)
        self.told = told
        self.t0 = time.monotonic()
        # Restarts kept for the plan's verification (study.verify_plan): not the search's.
        self.reserved = 0

    def why_not(self, in_flight: int, held: int = 0) -> str:
        """Why no further trial may start now ("" when one may); ``held``: trials asked that
        wait for a running one (no server of their own yet)."""
        if self.restarts + in_flight >= self.max_restarts - self.reserved:
            kept = f", {self.reserved} kept for the plan's verification" if self.reserved else ""
            return f"restart budget spent ({self.max_restarts} server launches{kept})"
        if self.n_trials is not None and self.told + in_flight + held >= self.n_trials:
            return f"study.n_trials reached ({plural(self.n_trials, 'trial')})"
        if self.max_wall_s is not None and time.monotonic() - self.t0 >= self.max_wall_s:
            return f"study.max_wall_s reached ({self.max_wall_s:g} s)"
        return ""


def halts_study(cfg: ExperimentConfig, number: int, result: TrialResult) -> str:
    """Why a trial's failure stops the study from starting trials ("" when it does not): a
    resource held outside the study, which no other configuration would get past."""
    if result.failure == FailureReason.NO_PLACEMENT.value:
        return (
            f"no room on the cluster: trial {number} was not placed within "
            f"cluster.placement_timeout_s ({cfg.cluster.placement_timeout_s:g} s; "
            "its configuration is queued again for a resume)"
        )
    if result.failure == FailureReason.PORT_IN_USE.value:
        return (
            f"trial {number}'s port was held by another process "
            f"({result.failure_detail[:200]}); no server started and its "
            "configuration is queued again: free the port (or choose another "
            "server.port) and run the same command again"
        )
    return ""
