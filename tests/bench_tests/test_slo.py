"""Goodput and the per-request SLO check (bench/_slo.py), on generated request records."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from rayspec._types import RequestRecord
from rayspec.bench import meets_slo
from rayspec.bench import per_run_goodput
from rayspec.bench import per_run_tok_s
from rayspec.bench import slo_metrics

INFINITE = {"ttft_p99_ms": math.inf, "itl_p99_ms": math.inf}


def _record(run: int, index: int, concurrency: int, tokens: int, ttft: float, gaps: list[float],
            start: float) -> RequestRecord:  # fmt: skip
    return RequestRecord(
        scenario="s", run=run, index=index, concurrency=concurrency, prompt_tokens=10,
        completion_tokens=tokens, ttft_ms=ttft, e2e_ms=ttft + sum(gaps) + 1.0,
        itl_ms=tuple(gaps), start_unix_s=start,
    )  # fmt: skip


_requests = st.lists(
    st.tuples(
        st.integers(0, 2),  # run
        st.integers(1, 300),  # tokens
        st.floats(1.0, 2000.0),  # ttft
        st.lists(st.floats(0.5, 400.0), max_size=8),  # gaps
        st.floats(0.0, 5.0),  # start offset
    ),
    min_size=1,
    max_size=20,
)
_slo = st.fixed_dictionaries(
    {}, optional={"ttft_p99_ms": st.floats(1.0, 3000.0), "itl_p99_ms": st.floats(0.5, 500.0)}
)


def _records(spec, concurrency: int) -> list[RequestRecord]:
    return [
        _record(run, i, concurrency, tokens, ttft, gaps, 1000.0 + start)
        for i, (run, tokens, ttft, gaps, start) in enumerate(spec)
    ]


@settings(max_examples=200, deadline=None)
@given(_requests, _slo, st.sampled_from([1, 4]))
def test_goodput_is_at_most_the_throughput_and_equal_without_a_limit(spec, slo, conc) -> None:
    records = _records(spec, conc)
    tok_s = per_run_tok_s(records)
    good = per_run_goodput(records, slo)
    assert good.keys() == tok_s.keys()
    for key, value in good.items():
        assert value <= tok_s[key] * (1 + 1e-12)
    assert per_run_goodput(records, INFINITE) == tok_s
    metrics = slo_metrics(records, INFINITE)
    assert metrics["slo_met_frac"] == 1.0 and metrics["slo_violation"] < 0


def test_a_request_meets_the_slo_by_its_ttft_and_its_own_p99_gap() -> None:
    steady = _record(0, 0, 1, 5, 100.0, [10.0, 10.0, 10.0, 10.0], 0.0)
    stall = _record(0, 1, 1, 5, 100.0, [10.0, 10.0, 10.0, 90.0], 0.0)
    assert meets_slo(steady, {"ttft_p99_ms": 100.0, "itl_p99_ms": 20.0})
    assert not meets_slo(steady, {"ttft_p99_ms": 99.0})
    assert not meets_slo(stall, {"itl_p99_ms": 20.0})  # one long gap is its p99
    assert meets_slo(_record(0, 2, 1, 1, 50.0, [], 0.0), {"itl_p99_ms": 0.1})  # no gap at all


def test_goodput_counts_the_tokens_of_the_requests_that_met_it() -> None:
    fast = _record(0, 0, 1, 100, 50.0, [9.0] * 99, 0.0)
    slow = _record(0, 1, 1, 100, 500.0, [9.0] * 99, 0.0)
    metrics = slo_metrics([fast, slow], {"ttft_p99_ms": 200.0})
    tok_s = per_run_tok_s([fast, slow])[("s", 0)]
    assert math.isclose(metrics["goodput"], tok_s / 2)
    assert metrics["slo_met_frac"] == 0.5
    assert metrics["slo_violation"] > 0  # the p99 TTFT over the two is the slow one's
