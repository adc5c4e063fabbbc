"""The pick so far, as the progress lines show it: ``pick 99.1 tok/s (trial 7+12), +57 % vs
baseline`` (the report's pick, from every stored row)."""

from __future__ import annotations

from collections.abc import Sequence

from rayspec._config import ExperimentConfig
from rayspec._types import TrialRecord
from rayspec.results import believes
from rayspec.results import build_report
from rayspec.search import Equivalence
from rayspec.tune._progress import PickView

__all__ = ["pick_line"]


def pick_line(
    records: Sequence[TrialRecord],
    roles: dict[int, str],
    cfg: ExperimentConfig,
    equivalent: Equivalence | None,
) -> tuple[str, PickView | None]:
    """The pick for the progress lines, and the same as data for a live display."""
    if not records:
        return "no pick yet", None
    report = build_report(records, roles, start_noise=cfg.study.start_noise, equivalent=equivalent,
                          margin=cfg.study.pick_margin, belief=believes(cfg))  # fmt: skip
    best = report.best
    if best is None:
        return "no pick yet", None
    gain = None
    if report.baseline is not None and report.baseline.trials != best.trials:
        gain = best.tok_s_mean / report.baseline.tok_s_mean - 1
    view = PickView(best.tok_s_mean, best.trials, gain)
    return f"pick {view.describe()}", view
