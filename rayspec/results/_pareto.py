"""The throughput/interactivity trade-off: each configuration at each load (scenario) as a
point (output tok/s per GPU, tok/s per user) and the Pareto front of those points.

A configuration is its launched trials (its server starts). tok/s per GPU is the scenario's
mean output throughput over those trials divided by the
server's GPUs (``server.tp_size``); tok/s per user is its mean per-request decode rate
(``user_tok_s_mean``: tokens after the first over the time after the first). Both are
maximised: a point is on the front when no other point is at least as good on both and better
on one. :func:`pareto_data` is the study's view of them (the report's table and
``pareto.png`` both draw it).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass

from rayspec._types import TrialRecord
from rayspec._types import TrialState

__all__ = ["ParetoPoint", "pareto_data", "pareto_front", "pareto_points"]


@dataclass(frozen=True)
class ParetoPoint:
    """One configuration at one load.

    Attributes:
        trials: the configuration's trials (its server starts).
        label: the configuration as the tables name it.
        scenario: the load.
        tok_s_per_gpu: output tok/s of the server per GPU.
        user_tok_s: the mean per-request decode rate (tok/s one user sees).
        feasible: every trial met ``study.slo`` at this load (True without an SLO).
        on_front: no other point dominates it.
    """

    trials: tuple[int, ...]
    label: str
    scenario: str
    tok_s_per_gpu: float
    user_tok_s: float
    feasible: bool = True
    on_front: bool = False


def pareto_front(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For each point (both coordinates maximised), whether no other point dominates it.

    Example:
        >>> pareto_front([(1.0, 5.0), (2.0, 2.0), (1.0, 1.0)])
        [True, True, False]
    """
    return [
        not any(
            ox >= x and oy >= y and (ox > x or oy > y)
            for j, (ox, oy) in enumerate(points)
            if j != i
        )
        for i, (x, y) in enumerate(points)
    ]


def _mean(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def _metric(records: Sequence[TrialRecord], name: str) -> list[float]:
    return [float(r.result.metrics.get(name, math.nan)) for r in records]


def pareto_points(
    records: Sequence[TrialRecord], scenarios: Sequence[str], gpus: int
) -> list[ParetoPoint]:
    """Every measured configuration (its launched trials pooled, whatever their goodput) at
    every scenario it measured, the front marked.

    Args:
        records: the stored trials.
        scenarios: the scenario names, the objective's (stored unprefixed) first.
        gpus: GPUs per server (``server.tp_size``).
    """
    groups: dict[str, list[TrialRecord]] = {}
    for r in sorted(records, key=lambda r: r.trial):
        if r.launched and r.result.state in (TrialState.COMPLETE, TrialState.PRUNED):
            groups.setdefault(r.candidate_key or r.candidate.label(), []).append(r)
    out: list[ParetoPoint] = []
    for measured in groups.values():
        trials = tuple(r.trial for r in measured)
        label = measured[0].candidate.label()
        for i, scenario in enumerate(scenarios):
            prefix = "" if i == 0 else f"{scenario}__"
            tok_s = _mean(_metric(measured, prefix + "tok_s_mean"))
            user = _mean(_metric(measured, prefix + "user_tok_s_mean"))
            if not (math.isfinite(tok_s) and math.isfinite(user)):
                continue
            feasible = not any(v > 0 for v in _metric(measured, prefix + "slo_violation"))
            out.append(ParetoPoint(trials, label, scenario, tok_s / max(1, gpus), user, feasible))
    front = pareto_front([(p.tok_s_per_gpu, p.user_tok_s) for p in out])
    return [
        ParetoPoint(p.trials, p.label, p.scenario, p.tok_s_per_gpu, p.user_tok_s, p.feasible, f)
        for p, f in zip(out, front, strict=True)
    ]


def pareto_data(
    records: Sequence[TrialRecord], concurrency: Mapping[str, int], gpus: int
) -> tuple[list[ParetoPoint], bool]:
    """A study's points (:func:`pareto_points` over every scenario it stored), and whether it
    had an SLO (a finite ``slo_violation`` stored).

    Args:
        records: the stored trials.
        concurrency: scenario -> concurrency, every scenario of the requests table; the one
            whose metrics are stored unprefixed is the objective's.
        gpus: GPUs per server (``server.tp_size``).
    """
    prefixed = sorted({
        k.split("__", 1)[0] for r in records for k in r.result.metrics
        if k.endswith("__tok_s_mean")
    })  # fmt: skip
    first = next((sc for sc in concurrency if sc not in prefixed), "objective")
    points = pareto_points(records, [first, *prefixed], gpus)
    slo = any(math.isfinite(float(r.result.metrics.get("slo_violation", math.nan)))
              for r in records)  # fmt: skip
    return points, slo
