"""Statistics: t quantiles, per-run throughput, summaries and comparisons against hand values."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rayspec import RequestRecord
from rayspec.bench import compare
from rayspec.bench import mean_ci95
from rayspec.bench import per_run_tok_s
from rayspec.bench import run_tok_s
from rayspec.bench import summarize
from rayspec.bench import t_cdf
from rayspec.bench import t_ppf
from rayspec.bench._tdist import betainc
from rayspec.bench._tdist import t_sf2


@pytest.mark.parametrize(
    ("p", "df", "expected"),
    [
        (0.975, 1, 12.706204736),
        (0.975, 2, 4.302652730),
        (0.975, 4, 2.776445105),
        (0.975, 10, 2.228138852),
        (0.975, 30, 2.042272456),
        (0.995, 4, 4.604094871),
        (0.95, 7, 1.894578605),
        (0.9, 3, 1.637744354),
        (0.975, math.inf, 1.959963985),
        (0.025, 4, -2.776445105),
        (0.5, 3, 0.0),
    ],
)
def test_t_ppf_known_values(p: float, df: float, expected: float) -> None:
    assert t_ppf(p, df) == pytest.approx(expected, abs=1e-8)


def test_t_cdf_closed_forms() -> None:
    for t in (-3.0, -0.5, 0.0, 0.7, 2.0, 10.0):
        # df = 1 is Cauchy; df = 2 has cdf 1/2 + t / (2 sqrt(2 + t^2)).
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)
    # Non-integer df (Welch) lies between its integer neighbours, and ppf inverts cdf.
    q = t_ppf(0.975, 2.5)
    assert t_ppf(0.975, 3) < q < t_ppf(0.975, 2)
    assert t_cdf(q, 2.5) == pytest.approx(0.975, abs=1e-10)
    assert t_sf2(t_ppf(0.975, 8), 8) == pytest.approx(0.05, abs=1e-10)


def test_betainc_identities() -> None:
    assert betainc(1.0, 1.0, 0.3) == pytest.approx(0.3)  # uniform
    assert betainc(2.0, 3.0, 0.4) == pytest.approx(1 - betainc(3.0, 2.0, 0.6))
    assert betainc(2.0, 1.0, 0.5) == pytest.approx(0.25)  # x^a for b = 1
    with pytest.raises(ValueError):
        betainc(0.0, 1.0, 0.5)
    with pytest.raises(ValueError):
        t_ppf(1.0, 3)


def rec(
    run: int,
    index: int = 0,
    *,
    tokens: int = 100,
    e2e_ms: float = 1000.0,
    ttft_ms: float = 50.0,
    start: float = 0.0,
    concurrency: int = 1,
    verify: int | None = None,
    itl: tuple[float, ...] = (),
    error: str | None = None,
    scenario: str = "s",
) -> RequestRecord:
    return RequestRecord(
        scenario=scenario,
        run=run,
        index=index,
        concurrency=concurrency,
        prompt_tokens=10,
        completion_tokens=tokens,
        ttft_ms=ttft_ms,
        e2e_ms=e2e_ms,
        itl_ms=itl,
        start_unix_s=1000.0 + start,
        spec_verify_ct=verify,
        accept_length=tokens / verify if verify else None,
        error=error,
    )


def test_run_tok_s_concurrency_one_and_many() -> None:
    assert run_tok_s([rec(0, tokens=500, e2e_ms=5000.0)]) == pytest.approx(100.0)
    # Concurrency 1, two sequential requests: tokens over summed request time.
    assert run_tok_s([rec(0, 0, e2e_ms=1000.0), rec(0, 1, e2e_ms=3000.0)]) == pytest.approx(50.0)
    # Concurrency 4: 4 x 100 tokens from t=0 to the last end at t=2.0 s.
    many = [
        rec(0, i, concurrency=4, start=s, e2e_ms=e)
        for i, (s, e) in enumerate([(0.0, 1000.0), (0.1, 1500.0), (0.5, 1500.0), (1.0, 1000.0)])
    ]
    assert run_tok_s(many) == pytest.approx(400 / 2.0)
    # Failed requests do not count; an all-failed run has no value.
    assert run_tok_s([rec(0), rec(0, 1, error="x", e2e_ms=10.0)]) == pytest.approx(100.0)
    assert math.isnan(run_tok_s([rec(0, error="x")]))


def test_summarize_against_hand_values() -> None:
    records = [
        rec(-1, tokens=500, e2e_ms=1000.0, ttft_ms=999.0),  # warm-up: ignored
        rec(0, tokens=500, e2e_ms=5000.0, ttft_ms=40.0, verify=250, itl=(10.0, 10.0)),
        rec(1, tokens=550, e2e_ms=5000.0, ttft_ms=50.0, verify=250, itl=(20.0,)),
        rec(2, tokens=600, e2e_ms=5000.0, ttft_ms=60.0, verify=300, itl=(30.0, 40.0)),
        rec(3, tokens=10, e2e_ms=5.0, error="crash_mid_benchmark: x"),
        rec(0, scenario="other", tokens=1, e2e_ms=1.0),
    ]
    s = summarize(records, scenario="s")
    assert all(isinstance(v, float) for v in s.values())
    # per-run tok/s: 100, 110, 120 (run 3 has no successful request)
    assert s["runs"] == 3.0
    assert s["tok_s_mean"] == pytest.approx(110.0)
    assert s["tok_s_std"] == pytest.approx(10.0)
    assert s["tok_s_cv"] == pytest.approx(10.0 / 110.0)
    assert (s["tok_s_min"], s["tok_s_max"], s["tok_s_peak"]) == pytest.approx(
        (100.0, 120.0, 120.0)
    )
    half = 4.302652730 * 10.0 / math.sqrt(3)
    assert s["tok_s_ci95_low"] == pytest.approx(110.0 - half)
    assert s["tok_s_ci95_high"] == pytest.approx(110.0 + half)
    assert s["accept_length"] == pytest.approx((2.0 + 2.2 + 2.0) / 3)
    assert s["ttft_ms_p50"] == pytest.approx(50.0)
    assert s["ttft_ms_p90"] == pytest.approx(float(np.percentile([40, 50, 60], 90)))
    assert s["itl_ms_p50"] == pytest.approx(20.0)
    assert s["itl_ms_mean"] == pytest.approx(22.0)
    assert s["tpot_ms_p50"] == pytest.approx((5000.0 - 50.0) / 549)
    assert s["requests_ok"] == 3.0 and s["requests_failed"] == 1.0
    assert s["output_tokens"] == 1650.0
    # Without a scenario filter, the other scenario's run counts too.
    assert summarize(records)["runs"] == 4.0
    assert list(per_run_tok_s(records, "s")) == [("s", 0), ("s", 1), ("s", 2), ("s", 3)]


def test_summarize_without_speculation_or_runs() -> None:
    s = summarize([rec(0), rec(1)])
    assert math.isnan(s["accept_length"])
    assert s["tok_s_std"] == 0.0
    empty = summarize([])
    assert empty["runs"] == 0.0 and math.isnan(empty["tok_s_mean"])
    one = summarize([rec(0)])
    assert one["tok_s_mean"] == pytest.approx(100.0) and math.isnan(one["tok_s_ci95_low"])


def test_mean_ci95_ignores_nan() -> None:
    mean, lo, hi = mean_ci95([1.0, float("nan"), 3.0])
    assert mean == 2.0
    assert hi - mean == pytest.approx(12.706204736 * math.sqrt(2) / math.sqrt(2))
    assert lo == pytest.approx(2.0 - (hi - mean))


def test_compare_identical_samples() -> None:
    a = [94.0, 95.1, 93.8, 96.9, 94.3]
    c = compare(a, list(a))
    assert c.ratio == pytest.approx(1.0)
    assert c.p_value == pytest.approx(1.0)
    assert not c.significant and c.within_noise
    assert c.ci95_low < 1.0 < c.ci95_high


def test_compare_clearly_different_samples() -> None:
    spec = [94.0, 95.1, 93.8, 96.9, 94.3]
    base = [88.8, 88.7, 89.0, 88.9, 88.6]
    c = compare(spec, base)
    assert c.ratio == pytest.approx(np.mean(spec) / np.mean(base))
    assert c.significant and not c.within_noise
    assert c.p_value < 1e-3
    assert 1.0 < c.ci95_low < c.ratio < c.ci95_high < 1.15


def test_compare_welch_against_hand_value() -> None:
    # Equal variances and sizes: t = -1, df = 8, two-sided p = 0.346594 (tables).
    c = compare([1, 2, 3, 4, 5], [2, 3, 4, 5, 6])
    assert c.df == pytest.approx(8.0)
    assert c.p_value == pytest.approx(0.3465935, abs=1e-6)
    assert not c.significant


def test_compare_noisy_small_difference_is_within_noise() -> None:
    # ~3 % apart with a CV of ~4 % over 5 runs: not significant (docs/twin-model.md, *Noise*).
    rng = np.random.default_rng(0)
    a = list(90 * (1 + 0.04 * rng.standard_normal(5)))
    b = list(87.3 * (1 + 0.04 * rng.standard_normal(5)))
    assert compare(a, b).within_noise


def test_compare_degenerate_inputs() -> None:
    c = compare([100.0], [90.0, 91.0])
    assert c.ratio == pytest.approx(100.0 / 90.5)
    assert math.isnan(c.p_value) and not c.significant
    assert compare([1.0, 1.0], [1.0, 1.0]).p_value == 1.0
    z = compare([2.0, 2.0], [1.0, 1.0])
    assert z.significant and z.ratio == 2.0
    assert math.isnan(compare([], [1.0, 2.0]).ratio)
