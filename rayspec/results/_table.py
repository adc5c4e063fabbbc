"""The configuration table of a study: one row per configuration, and how it compares.

:class:`Row` and :class:`StudyReport` are what :func:`~rayspec.results.build_report` returns and
what the study's terminal table, ``report.md`` and ``best.*`` all show; :func:`vs_baseline` is
the one way a row is put against the baseline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rayspec._types import Candidate

__all__ = ["Row", "StudyReport", "WITHIN_NOISE", "vs_baseline", "within_noise"]

# P(faster than the baseline) strictly between these: the difference is within noise.
WITHIN_NOISE = (0.05, 0.95)


@dataclass(frozen=True)
class Row:
    """One configuration as the report shows it: every start of it pooled.

    Attributes:
        trials: the trials that measured it (its server starts), first first.
        tok_s_mean: the estimate the pick uses (starts pooled, neighbours too; tok/s).
        tok_s_runs: the plain mean of every measured run.
        tok_s_peak: the best run.
        sd: the estimate's relative standard deviation.
        starts, runs: server starts and measured runs pooled.
        reused_by: later trials that asked for the same configuration and reused this
            measurement (no server started for them).
    """

    trials: tuple[int, ...]
    label: str
    candidate: Candidate
    role: str
    tok_s_mean: float
    tok_s_runs: float
    tok_s_peak: float
    accept_length: float
    sd: float
    starts: int
    runs: int
    vs_baseline_confidence: float = math.nan  # P(faster than the baseline)
    per_scenario: tuple[tuple[str, float], ...] = ()
    alarm: str = ""  # the acceptance alarm's hint, when one of its trials raised it
    reused_by: tuple[int, ...] = ()
    feasible: bool = True  # every start met study.slo (False: never picked while one did)

    @property
    def trial(self) -> int:
        return self.trials[0]

    @property
    def ok(self) -> bool:
        return math.isfinite(self.tok_s_mean)


@dataclass(frozen=True)
class StudyReport:
    rows: tuple[Row, ...]  # measured configurations, best estimate first
    baseline: Row | None
    best: Row | None  # the pick
    failed: int
    pruned: int
    total: int  # trials
    fastest: Row | None = None  # the best estimate (differs from best when a floor held)
    pick_note: str = ""  # why best is not the fastest, when it is not
    best_per_scenario: tuple[tuple[str, Row], ...] = ()
    bench_s_saved: float = 0.0
    reused: int = 0  # trials that repeated a measured configuration (no server started)
    restarts: int = 0  # server launches
    failures: tuple[tuple[int, str, str], ...] = ()  # (trial, config, reason)


def within_noise(row: Row, baseline: Row | None) -> bool:
    """Whether ``row`` is neither surely faster nor surely slower than the baseline."""
    low, high = WITHIN_NOISE
    return (
        baseline is not None
        and row.trials != baseline.trials
        and low < row.vs_baseline_confidence < high
    )


def vs_baseline(row: Row, baseline: Row | None, *, noise: bool = False) -> str:
    """``+12.3 %``: the row's estimate against the baseline's ("—" for the baseline itself, or
    without one); ``noise`` appends `` (within noise)`` where :func:`within_noise` holds."""
    if baseline is None or row.trials == baseline.trials or not baseline.tok_s_mean:
        return "—"
    text = f"{(row.tok_s_mean / baseline.tok_s_mean - 1) * 100:+.1f} %"
    if noise and within_noise(row, baseline):
        text += " (within noise)"
    return text
