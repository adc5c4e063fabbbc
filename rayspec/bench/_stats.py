"""Statistics over request records (pure): per-run throughput, latency percentiles, comparisons.

A measurement is a distribution of *runs*: each run gives one output-throughput value, and the
mean, spread and confidence interval are over runs. Warm-up records (``run == -1``) never count.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Iterable
from collections.abc import Sequence

import numpy as np

from rayspec._types import RequestRecord
from rayspec._types import category_key
from rayspec.bench._tdist import t_ppf
from rayspec.bench._tdist import t_sf2

_NAN = float("nan")
_PCTS = (50, 90, 99)


def run_tok_s(records: Sequence[RequestRecord]) -> float:
    """Output throughput of one run (successful requests only; NaN if none).

    Concurrency 1 (requests one after another): the tokens over the summed request times, which
    for one request is ``completion_tokens / e2e`` (TTFT included), as the field protocol
    measures it. Concurrency > 1: all tokens over the run's time, from the first request's
    start to the last request's end: on the twin's simulated clock when every request has its
    start there (``sim_start_s``, a closed loop timed by the twin's clock), else on the wall
    clock (``start_unix_s``).
    """
    ok = [r for r in records if r.ok and r.e2e_ms > 0]
    if not ok:
        return _NAN
    tokens = sum(r.completion_tokens for r in ok)
    if max(r.concurrency for r in ok) <= 1:
        return tokens / (sum(r.e2e_ms for r in ok) / 1000.0)
    sim = [r.sim_start_s for r in ok]
    starts = [s for s in sim if s is not None]
    if len(starts) < len(ok):
        starts = [r.start_unix_s for r in ok]
    start = min(starts)
    end = max(s + r.e2e_ms / 1000.0 for s, r in zip(starts, ok, strict=True))
    return tokens / (end - start) if end > start else _NAN


def per_run_tok_s(
    records: Iterable[RequestRecord], scenario: str | None = None
) -> dict[tuple[str, int], float]:
    """``{(scenario, run): tok/s}`` for every measured run (warm-up excluded), in run order."""
    runs: dict[tuple[str, int], list[RequestRecord]] = defaultdict(list)
    for r in records:
        if r.run >= 0 and (scenario is None or r.scenario == scenario):
            runs[(r.scenario, r.run)].append(r)
    return {key: run_tok_s(runs[key]) for key in sorted(runs)}


def mean_ci95(values: Sequence[float]) -> tuple[float, float, float]:
    """Mean and the two-sided 95 % Student-t confidence interval of the mean (NaN for n < 2)."""
    x = np.asarray([v for v in values if math.isfinite(v)], dtype=float)
    if x.size == 0:
        return _NAN, _NAN, _NAN
    mean = float(x.mean())
    if x.size < 2:
        return mean, _NAN, _NAN
    half = t_ppf(0.975, x.size - 1) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return mean, mean - half, mean + half


def _percentiles(prefix: str, values: Sequence[float]) -> dict[str, float]:
    x = np.asarray([v for v in values if math.isfinite(v)], dtype=float)
    if x.size == 0:
        return {f"{prefix}_p{p}": _NAN for p in _PCTS} | {f"{prefix}_mean": _NAN}
    out = {f"{prefix}_p{p}": float(np.percentile(x, p)) for p in _PCTS}
    out[f"{prefix}_mean"] = float(x.mean())
    return out


def summarize(records: Iterable[RequestRecord], scenario: str | None = None) -> dict[str, float]:
    """Summarise measured runs into float metrics (NaN where a value does not exist).

    Args:
        records: records of one or more scenarios; warm-up records are ignored.
        scenario: restrict to one scenario (recommended when several were run).

    Returns:
        ``tok_s_mean``, ``tok_s_std`` (ddof 1), ``tok_s_cv``, ``tok_s_min``, ``tok_s_max`` and
        ``tok_s_peak`` (the same value), ``tok_s_ci95_low``/``high`` (Student t over runs),
        ``accept_length`` (mean over successful requests of ``completion_tokens /
        spec_verify_ct``; NaN without speculation), ``ttft_ms_*``, ``itl_ms_*`` (over all
        tokens), ``tpot_ms_*``, ``e2e_ms_*`` as ``_p50``/``_p90``/``_p99``/``_mean``,
        ``requests_ok``, ``requests_failed``, ``runs``, ``output_tokens``.

    Example:
        >>> summarize([])["runs"]
        0.0
    """
    measured = [r for r in records if r.run >= 0 and (scenario is None or r.scenario == scenario)]
    ok = [r for r in measured if r.ok]
    per_run = [v for v in per_run_tok_s(measured).values() if math.isfinite(v)]
    x = np.asarray(per_run, dtype=float)
    mean, lo, hi = mean_ci95(per_run)
    std = float(x.std(ddof=1)) if x.size >= 2 else _NAN
    out: dict[str, float] = {
        "tok_s_mean": mean,
        "tok_s_std": std,
        "tok_s_cv": std / mean if x.size >= 2 and mean > 0 else _NAN,
        "tok_s_min": float(x.min()) if x.size else _NAN,
        "tok_s_max": float(x.max()) if x.size else _NAN,
        "tok_s_peak": float(x.max()) if x.size else _NAN,
        "tok_s_ci95_low": lo,
        "tok_s_ci95_high": hi,
    }
    accepts = [r.accept_length for r in ok if r.accept_length is not None]
    out["accept_length"] = float(np.mean(accepts)) if accepts else _NAN
    out |= _percentiles("ttft_ms", [r.ttft_ms for r in ok])
    out |= _percentiles("itl_ms", [v for r in ok for v in r.itl_ms])
    out |= _percentiles("tpot_ms", [r.tpot_ms for r in ok if r.completion_tokens > 1])
    out |= _percentiles("e2e_ms", [r.e2e_ms for r in ok])
    out["requests_ok"] = float(len(ok))
    out["requests_failed"] = float(len(measured) - len(ok))
    out["runs"] = float(x.size)
    out["output_tokens"] = float(sum(r.completion_tokens for r in ok))
    return out


def category_metrics(
    records: Iterable[RequestRecord], scenario: str | None = None
) -> dict[str, float]:
    """Per prompt category, over the measured runs (warm-up excluded) of ``scenario``.

    ``requests``: the category's measured requests, failed ones included (the counts add up
    to ``requests_ok + requests_failed``); ``tok_s``: its successful requests' completion
    tokens over their summed request times (TTFT included): at concurrency 1 the run
    throughput of that category alone, under load one stream's speed; ``accept_length``: the
    mean of its successful requests' accept lengths (NaN without speculation). A category
    without a successful request has NaN figures.

    Example:
        >>> category_metrics([])
        {}
    """
    by_cat: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in records:
        if r.run >= 0 and (scenario is None or r.scenario == scenario):
            by_cat[r.category].append(r)
    out: dict[str, float] = {}
    for cat in sorted(by_cat):
        ok = [r for r in by_cat[cat] if r.ok and r.e2e_ms > 0]
        secs = sum(r.e2e_ms for r in ok) / 1000.0
        accepts = [r.accept_length for r in ok if r.accept_length is not None]
        out[category_key(cat, "requests")] = float(len(by_cat[cat]))
        out[category_key(cat, "tok_s")] = (
            sum(r.completion_tokens for r in ok) / secs if secs > 0 else _NAN
        )
        out[category_key(cat, "accept_length")] = float(np.mean(accepts)) if accepts else _NAN
    return out


@dataclasses.dataclass(frozen=True)
class Comparison:
    """How sample ``a`` compares with sample ``b`` (e.g. a candidate against the baseline).

    Attributes:
        ratio: ``mean(a) / mean(b)``.
        ci95_low, ci95_high: 95 % confidence interval of the ratio (delta method on the log
            ratio with Welch's degrees of freedom; see :func:`compare`).
        p_value: two-sided Welch t-test p-value for ``mean(a) == mean(b)``.
        significant: ``p_value < alpha``.
        df: Welch-Satterthwaite degrees of freedom.
    """

    ratio: float
    ci95_low: float
    ci95_high: float
    p_value: float
    significant: bool
    df: float = _NAN

    @property
    def within_noise(self) -> bool:
        """The difference is not distinguishable from run-to-run noise."""
        return not self.significant


def compare(
    a_values: Sequence[float], b_values: Sequence[float], *, alpha: float = 0.05
) -> Comparison:
    """Compare two samples of per-run values with Welch's t test.

    The ratio's confidence interval uses the delta method on ``log(mean_a / mean_b)``:
    ``se² = s_a² / (n_a mean_a²) + s_b² / (n_b mean_b²)`` and
    ``CI = ratio · exp(± t(0.975, df) · se)`` with Welch's ``df``. It is always positive and
    asymmetric like the ratio itself; for the small CVs of throughput runs (< 10 %) it agrees
    with Fieller's interval to within a fraction of a percent.

    With fewer than 2 finite values in either sample there is no test: ``p_value`` and the CI
    are NaN and ``significant`` is False. Two samples without any spread are significant
    exactly when their means differ.

    Example:
        >>> c = compare([94.0, 95.1, 93.8, 96.9, 94.3], [88.8, 88.7, 89.0, 88.9, 88.6])
        >>> round(c.ratio, 3), c.significant
        (1.062, True)
    """
    a = np.asarray([v for v in a_values if math.isfinite(v)], dtype=float)
    b = np.asarray([v for v in b_values if math.isfinite(v)], dtype=float)
    if a.size == 0 or b.size == 0:
        return Comparison(_NAN, _NAN, _NAN, _NAN, False)
    ma, mb = float(a.mean()), float(b.mean())
    ratio = ma / mb if mb != 0 else _NAN
    if a.size < 2 or b.size < 2:
        return Comparison(ratio, _NAN, _NAN, _NAN, False)
    va, vb = float(a.var(ddof=1)) / a.size, float(b.var(ddof=1)) / b.size
    if va + vb == 0.0:
        differ = ma != mb
        return Comparison(
            ratio, ratio, ratio, 0.0 if differ else 1.0, differ, float(a.size + b.size - 2)
        )
    t = (ma - mb) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    p = t_sf2(t, df)
    lo = hi = _NAN
    if ma > 0 and mb > 0:
        se = math.sqrt(va / ma**2 + vb / mb**2)
        q = t_ppf(0.975, df)
        lo, hi = ratio * math.exp(-q * se), ratio * math.exp(q * se)
    return Comparison(ratio, lo, hi, p, bool(p < alpha), df)
