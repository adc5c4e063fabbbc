"""The measured trials pruning and the comparison columns need: the baseline and the incumbent."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence

from rayspec._types import TrialRecord
from rayspec._types import TrialState
from rayspec.tune._decide import Measured
from rayspec.tune._decide import comparison_metrics

__all__ = ["Ledger", "load_ledger"]


class Ledger:
    """Every measured start of the study, by trial; the baseline among them.

    Shared between the trial threads (pruning) and the main thread (recording): guarded.
    """

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self._lock = threading.Lock()
        self._measured: dict[int, Measured] = {}
        self.baseline: int | None = None

    def add(self, m: Measured) -> None:
        with self._lock:
            self._measured[m.trial] = m

    def get(self, trial: int) -> Measured | None:
        with self._lock:
            return self._measured.get(trial)

    def incumbent(self) -> Measured | None:
        with self._lock:
            ranked = [m for m in self._measured.values() if math.isfinite(m.mean)]
        return max(ranked, key=lambda m: m.mean) if ranked else None

    def comparisons(self, runs: list[float]) -> dict[str, float]:
        """This trial against the baseline and the incumbent (ratio, CI, p, significant)."""
        out: dict[str, float] = {}
        base = self.get(self.baseline) if self.baseline is not None else None
        if base is not None:
            out |= comparison_metrics("vs_baseline", runs, base.runs, self.alpha)
        inc = self.incumbent()
        if inc is not None:
            out |= comparison_metrics("vs_incumbent", runs, inc.runs, self.alpha)
            out["incumbent_trial"] = float(inc.trial)
        return out


def load_ledger(alpha: float, records: Sequence[TrialRecord], roles: dict[int, str]) -> Ledger:
    """The ledger of a resumed study, from its stored rows."""
    ledger = Ledger(alpha)
    for r in records:
        if r.result.state is TrialState.COMPLETE and r.run_values and not r.reused:
            ledger.add(Measured(r.trial, r.candidate, r.run_values))
    # The baseline measured last (an interrupted baseline's retry holds the role too).
    measured = [n for n, r in roles.items() if r == "baseline" and ledger.get(n) is not None]
    ledger.baseline = max(measured, default=None)
    return ledger
