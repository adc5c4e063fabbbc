"""How sure the report is: the pick's interval, the configurations tied with it within the
noise and the rule that chose among them, estimates above their own peak, what each change
bought against the baseline (NCCL alone, speculation on top, the joint pick) and what
speculation bought on the pick's own NCCL set.

Presentation only: every function reads a :class:`~rayspec.results.StudyReport` as
:func:`~rayspec.results.build_report` returned it and never chooses anything itself; the terminal,
``report.md``, ``best.sh`` and ``best.yaml`` all say it in these words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rayspec.results._pick import cost_key
from rayspec.results._table import WITHIN_NOISE
from rayspec.results._table import Row
from rayspec.results._table import StudyReport
from rayspec.search import Estimate
from rayspec.search import prob_better

__all__ = [
    "ABOVE_PEAK_WHY",
    "Gain",
    "above_peak",
    "gains",
    "interval",
    "prob_faster",
    "speculation_gain",
    "tie_note",
    "tied_with_pick",
]

Z95 = 1.96

ABOVE_PEAK_WHY = (
    "the estimate is above the best run this configuration measured: it pools its neighbours "
    "through the fitted surface (and its starts towards the noise model), so where the "
    "neighbours ran faster it is lifted above its own runs; the peak is what was measured"
)


def interval(row: Row) -> tuple[float, float]:
    """The 95 % interval of the row's estimate (tok/s), as report.md's ``±`` shows it."""
    half = Z95 * row.sd * row.tok_s_mean
    if not math.isfinite(half):
        return math.nan, math.nan
    return row.tok_s_mean - half, row.tok_s_mean + half


def above_peak(row: Row) -> bool:
    """Whether the row shows an estimate above its own best measured run."""
    return (
        math.isfinite(row.tok_s_mean)
        and math.isfinite(row.tok_s_peak)
        and row.tok_s_mean > row.tok_s_peak
    )


def _estimate(row: Row) -> Estimate:
    return Estimate(row.tok_s_mean, row.sd, row.starts, row.runs, math.nan)


def prob_faster(a: Row, b: Row) -> float:
    """P(``a``'s true tok/s > ``b``'s), from the two estimates as the pick judged them."""
    if not (a.ok and b.ok and a.tok_s_mean > 0 and b.tok_s_mean > 0):
        return math.nan
    if not (math.isfinite(a.sd) and math.isfinite(b.sd)):
        return math.nan
    return prob_better(_estimate(a), _estimate(b))


def tied_with_pick(report: StudyReport) -> list[tuple[Row, float]]:
    """The measured configurations the pick cannot be told apart from: ``(row, P(row faster
    than the pick))`` with that probability strictly inside :data:`WITHIN_NOISE`, best
    estimate first."""
    best = report.best
    if best is None:
        return []
    low, high = WITHIN_NOISE
    out = []
    for row in report.rows:
        if row.trials == best.trials:
            continue
        p = prob_faster(row, best)
        if math.isfinite(p) and low < p < high:
            out.append((row, p))
    return out


def _trials(row: Row) -> str:
    which = "trial" if len(row.trials) == 1 else "trials"
    return f"{which} {', '.join(str(t) for t in row.trials)}"


def _rule(report: StudyReport, tied: list[tuple[Row, float]], margin: float) -> str:
    """The rule that chose the pick among the rows it is tied with, as its outcome shows."""
    best = report.best
    assert best is not None
    faster = [r for r, _ in tied if r.tok_s_mean > best.tok_s_mean]
    if not faster:
        cheapest = all(cost_key(best.candidate) < cost_key(r.candidate) for r, _ in tied)
        also = ", and it is the cheapest of them too" if cheapest else ""
        if margin > 0:
            return (
                f"picked the higher estimate (none cheaper within study.pick_margin, "
                f"{margin:.0%}){also}"
            )
        return (
            "picked the higher estimate (study.pick_margin is 0: no preference for the "
            f"cheaper){also}"
        )
    if all(cost_key(best.candidate) < cost_key(r.candidate) for r in faster):
        within = f", within study.pick_margin ({margin:.0%})" if margin > 0 else ""
        return f"picked the cheaper (fewer draft tokens, then fewer steps: cost_key{within})"
    if best.role:
        return (
            f"kept the {best.role} configuration (a floor: a rival replaces it only on strong "
            "evidence)"
        )
    return "picked as the pick's note says" if report.pick_note else "picked the higher estimate"


def tie_note(report: StudyReport, margin: float = 0.0, *, shown: int = 3) -> str:
    """One line when the pick is tied within the noise with other configurations: which, how
    sure (P(faster than the pick)), and the rule that chose; "" when nothing is tied.

    Example: ``tied within noise with trial 12 (P=0.58 faster); picked the cheaper (...)``.
    """
    tied = tied_with_pick(report)
    if not tied:
        return ""
    names = ", ".join(f"{_trials(r)} (P={p:.2f} faster)" for r, p in tied[:shown])
    if len(tied) > shown:
        names += f" and {len(tied) - shown} more"
    return (
        f"the pick is tied within noise with {names}; {_rule(report, tied, margin)}; another "
        "start of any of them could change the order"
    )


@dataclass(frozen=True)
class Gain:
    """What one change bought against a reference configuration (the baseline by default).

    Attributes:
        what: the change, e.g. ``NCCL alone (speculation off)``.
        row: the configuration that measured it (None: the study has no such trial).
        ratio: the row's estimate over the reference's (nan without a row or a reference).
        low, high: the ratio's 95 % interval (both estimates' uncertainty, log scale).
        against: the reference when it is not the baseline.
        missing: why ``row`` is None, and what would measure it.
    """

    what: str
    row: Row | None
    ratio: float = math.nan
    low: float = math.nan
    high: float = math.nan
    against: Row | None = None
    missing: str = "the study has no such trial"

    @property
    def reference(self) -> str:
        """What the ratio is against: ``the baseline`` or ``trial 11 (no speculation; ...)``."""
        if self.against is None:
            return "the baseline"
        return f"{_trials(self.against)} ({self.against.label})"

    def describe(self) -> str:
        """``NCCL alone (...): 1.44x the baseline (95 %: 1.41-1.47), trial 10: <config>``."""
        if self.row is None:
            return f"{self.what}: not measured ({self.missing})"
        if not math.isfinite(self.ratio):
            return f"{self.what}: {_trials(self.row)}: {self.row.label} (no baseline to compare)"
        text = f"{self.what}: {self.ratio:.2f}x "
        text += "the baseline" if self.against is None else "no speculation there"
        if math.isfinite(self.low):
            text += f" (95 %: {self.low:.2f}-{self.high:.2f})"
        if self.against is None:
            return f"{text}, {_trials(self.row)}: {self.row.label}"
        # The pick's label is the joint pick's line: the reference is what this one adds.
        return f"{text}, {_trials(self.row)} against {self.reference}"


def _gain(what: str, row: Row | None, base: Row | None, against: Row | None = None) -> Gain:
    if row is None or base is None or not (row.ok and base.ok and base.tok_s_mean > 0):
        return Gain(what, row, against=against)
    ratio = row.tok_s_mean / base.tok_s_mean
    sd = math.hypot(row.sd, base.sd)
    if not math.isfinite(sd):
        return Gain(what, row, ratio, against=against)
    low, high = ratio * math.exp(-Z95 * sd), ratio * math.exp(Z95 * sd)
    return Gain(what, row, ratio, low, high, against=against)


def _best(rows: list[Row]) -> Row | None:
    ok = [r for r in rows if r.ok]
    return max(ok, key=lambda r: (r.tok_s_mean, -r.trial)) if ok else None


def gains(report: StudyReport) -> list[Gain]:
    """The field table's decomposition, each against the baseline: NCCL alone (the best
    measured NCCL set with speculation off), speculation on top of the baseline's NCCL, and
    the joint pick."""
    base = report.baseline
    nccl = base.candidate.nccl_env if base is not None else ()
    flags = base.candidate.server_settings if base is not None else ()
    others = [r for r in report.rows if base is None or r.trials != base.trials]
    nccl_alone = _best([
        r for r in others if r.candidate.spec is None and r.candidate.nccl_env != nccl
        and r.candidate.server_settings == flags
    ])  # fmt: skip
    spec_alone = _best([
        r for r in others if r.candidate.spec is not None and r.candidate.nccl_env == nccl
        and r.candidate.server_settings == flags
    ])  # fmt: skip
    return [
        _gain("NCCL alone (speculation off)", nccl_alone, base),
        _gain("speculation on top (the baseline's NCCL)", spec_alone, base),
        _gain("the joint pick", report.best, base),
    ]


SPECULATION_GAIN = "speculation on the pick's NCCL"


def speculation_gain(report: StudyReport) -> Gain:
    """What speculation bought the pick: its estimate over the best measured configuration
    without speculation on the same NCCL set and server settings (the structured search
    measures that one; the baseline when the pick keeps NCCL's defaults).

    A default study screens NCCL first and searches speculation on the screened set, so it has
    no speculative trial on the baseline's NCCL: this is the ratio it can state, with the same
    interval as :func:`gains`. Not measured: the pick runs no speculation, or no trial ran
    without it on the pick's set (then ``missing`` names the enqueue entry that measures it).
    """
    best = report.best
    if best is None:
        return Gain(SPECULATION_GAIN, None, missing="no pick")
    if best.candidate.spec is None:
        return Gain(SPECULATION_GAIN, None, missing="the pick runs no speculation")
    cand = best.candidate
    off = _best([
        r for r in report.rows if r.candidate.spec is None
        and r.candidate.nccl_env == cand.nccl_env
        and r.candidate.server_settings == cand.server_settings
    ])  # fmt: skip
    if off is None:
        entry = ", ".join(["spec.mode: off", *(f"nccl.{k}: {v}" for k, v in cand.nccl_env)])
        more = " (with the pick's server settings)" if cand.server_settings else ""
        return Gain(SPECULATION_GAIN, None, missing=(
            "no trial ran without speculation on the pick's NCCL set; study.enqueue "
            f"{{{entry}}}{more} measures it"
        ))  # fmt: skip
    return _gain(SPECULATION_GAIN, best, off, against=off)
