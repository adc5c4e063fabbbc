"""Decisions made from one trial's runs (pure): pruning and comparisons.

The final pick pools every start of a configuration and lives with the search
(:func:`rayspec.search.pick`).

A measurement is a list of per-run values (output tok/s of one run each). Noise is estimated
from the runs themselves; a trial with too few runs borrows the incumbent's spread, which the
same server set-up produced under the same protocol.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rayspec._types import Candidate
from rayspec.bench import Comparison
from rayspec.bench import compare
from rayspec.bench import t_ppf

__all__ = [
    "Measured",
    "cannot_beat",
    "comparison_metrics",
]


@dataclass(frozen=True)
class Measured:
    """A finished trial as the decisions see it."""

    trial: int
    candidate: Candidate
    runs: tuple[float, ...]  # per-run values of the objective scenario

    @property
    def mean(self) -> float:
        finite = [v for v in self.runs if math.isfinite(v)]
        return float(np.mean(finite)) if finite else math.nan


def cannot_beat(
    runs: Sequence[float],
    incumbent: Sequence[float],
    *,
    min_runs: int = 1,
    between: float = 0.0,
) -> bool:
    """Whether a trial with ``runs`` so far cannot beat the incumbent (prune it).

    The rule is a one-sided 99 % upper bound on the trial's mean (conservative: the trial is
    a server start already paid for, and what it still measures costs seconds): prune when
    ``mean(runs) + t(0.99, df) * sqrt(s**2 / n + 2 * (between * mean)**2)`` is below
    ``mean(incumbent)``. ``s`` pools the run-to-run variance of the trial and the incumbent
    (the same server set-up under the same protocol), so a trial can be judged after its first
    run; ``df`` counts both. ``between`` is the relative noise between server starts, which
    the two trials' levels carry on top (each its own start). Without an incumbent of at least
    two runs nothing is pruned.
    """
    x = np.asarray([v for v in runs if math.isfinite(v)], dtype=float)
    inc = np.asarray([v for v in incumbent if math.isfinite(v)], dtype=float)
    if x.size < max(1, min_runs) or inc.size < 2:
        return False
    df = (x.size - 1) + (inc.size - 1)
    ss = float(((inc - inc.mean()) ** 2).sum())
    if x.size >= 2:
        ss += float(((x - x.mean()) ** 2).sum())
    s = math.sqrt(ss / df)
    spread = math.sqrt(s**2 / x.size + 2 * (between * float(x.mean())) ** 2)
    upper = float(x.mean()) + t_ppf(0.99, df) * spread
    return upper < float(inc.mean())


def comparison_metrics(prefix: str, runs: Sequence[float], other: Sequence[float],
                       alpha: float) -> dict[str, float]:  # fmt: skip
    """``<prefix>_ratio``, ``_ci95_low``, ``_ci95_high``, ``_p``, ``_significant`` (1.0/0.0)."""
    c: Comparison = compare(runs, other, alpha=alpha)
    return {
        f"{prefix}_ratio": c.ratio,
        f"{prefix}_ci95_low": c.ci95_low,
        f"{prefix}_ci95_high": c.ci95_high,
        f"{prefix}_p": c.p_value,
        f"{prefix}_significant": 1.0 if c.significant else 0.0,
    }
