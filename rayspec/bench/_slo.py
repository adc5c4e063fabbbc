"""A latency SLO over request records (pure): which requests met it, goodput, feasibility.

A request meets the SLO (``study.slo``) when it succeeded, its TTFT is within ``ttft_p99_ms``
and its own p99 inter-token gap is within ``itl_p99_ms`` (a request of one token has no gap and
meets any ITL limit). A run's goodput is the run's output throughput (:func:`run_tok_s`) times
the share of its output tokens that came from such requests: the tokens of the requests that
met the SLO over the run's time, so goodput <= throughput, equal when every request met it.

A trial is feasible at a load when the p99 over its requests of each SLO'd value (TTFT, a
request's p99 gap) is within its limit; ``slo_violation`` is the largest ``p99 / limit - 1``
(<= 0: feasible), the value told to Optuna as the trial's constraint.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence

import numpy as np

from rayspec._types import RequestRecord
from rayspec.bench._stats import run_tok_s

__all__ = [
    "SLO_METRICS",
    "meets_slo",
    "per_run_goodput",
    "request_itl_p99",
    "slo_metrics",
    "user_tok_s",
]

_NAN = float("nan")

#: The metrics :func:`slo_metrics` returns (a trial row's columns, per scenario).
SLO_METRICS = (
    "goodput", "slo_met_frac", "slo_ttft_p99_ms", "slo_itl_p99_ms", "slo_violation",
    "user_tok_s_mean",
)  # fmt: skip


def request_itl_p99(r: RequestRecord) -> float:
    """The request's own p99 inter-token gap (ms); 0 for a request without gaps."""
    return float(np.percentile(np.asarray(r.itl_ms, dtype=float), 99)) if r.itl_ms else 0.0


def meets_slo(r: RequestRecord, slo: Mapping[str, float]) -> bool:
    """Whether the request succeeded within every limit of ``slo``."""
    if not r.ok:
        return False
    if "ttft_p99_ms" in slo and not r.ttft_ms <= slo["ttft_p99_ms"]:
        return False
    return not ("itl_p99_ms" in slo and not request_itl_p99(r) <= slo["itl_p99_ms"])


def _goodput(records: Sequence[RequestRecord], slo: Mapping[str, float]) -> float:
    tok_s = run_tok_s(records)
    ok = [r for r in records if r.ok and r.e2e_ms > 0]
    tokens = sum(r.completion_tokens for r in ok)
    if not math.isfinite(tok_s) or tokens <= 0:
        return tok_s
    good = sum(r.completion_tokens for r in ok if meets_slo(r, slo))
    return tok_s if good == tokens else tok_s * good / tokens


def per_run_goodput(
    records: Iterable[RequestRecord], slo: Mapping[str, float], scenario: str | None = None
) -> dict[tuple[str, int], float]:
    """``{(scenario, run): goodput}`` for every measured run, as :func:`per_run_tok_s`."""
    runs: dict[tuple[str, int], list[RequestRecord]] = defaultdict(list)
    for r in records:
        if r.run >= 0 and (scenario is None or r.scenario == scenario):
            runs[(r.scenario, r.run)].append(r)
    return {key: _goodput(runs[key], slo) for key in sorted(runs)}


def user_tok_s(r: RequestRecord) -> float:
    """One request's decode rate as its user sees it: tokens after the first per second
    after the first (NaN for a failed or one-token request)."""
    decode_s = (r.e2e_ms - r.ttft_ms) / 1000.0
    if not r.ok or r.completion_tokens < 2 or not decode_s > 0:
        return _NAN
    return (r.completion_tokens - 1) / decode_s


def _p99(values: Sequence[float]) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), 99)) if values else _NAN


def slo_metrics(
    records: Iterable[RequestRecord], slo: Mapping[str, float], scenario: str | None = None
) -> dict[str, float]:
    """The SLO's view of the measured runs (warm-up left out), keys :data:`SLO_METRICS`.

    ``goodput`` is the mean of the per-run goodputs; ``slo_met_frac`` the share of measured
    requests that met the SLO; ``slo_ttft_p99_ms``/``slo_itl_p99_ms`` the p99 over successful
    requests of the TTFT and of each request's p99 gap; ``slo_violation`` the largest
    ``p99 / limit - 1`` over the limits set (NaN without limits or requests: no constraint);
    ``user_tok_s_mean`` the mean per-request decode rate (:func:`user_tok_s`).

    Example:
        >>> slo_metrics([], {"ttft_p99_ms": 100.0})["goodput"]
        nan
    """
    measured = [r for r in records if r.run >= 0 and (scenario is None or r.scenario == scenario)]
    ok = [r for r in measured if r.ok]
    runs = [v for v in per_run_goodput(measured, slo).values() if math.isfinite(v)]
    ttft = _p99([r.ttft_ms for r in ok])
    itl = _p99([request_itl_p99(r) for r in ok])
    ratios = [
        value / slo[key]
        for key, value in (("ttft_p99_ms", ttft), ("itl_p99_ms", itl))
        if key in slo and math.isfinite(value)
    ]
    rates = [v for v in (user_tok_s(r) for r in ok) if math.isfinite(v)]
    return {
        "goodput": float(np.mean(runs)) if runs else _NAN,
        "slo_met_frac": sum(meets_slo(r, slo) for r in measured) / len(measured)
        if measured
        else _NAN,
        "slo_ttft_p99_ms": ttft,
        "slo_itl_p99_ms": itl,
        "slo_violation": max(ratios) - 1.0 if ratios else _NAN,
        "user_tok_s_mean": float(np.mean(rates)) if rates else _NAN,
    }
