"""The bench client against the digital twin (a subprocess speaking SGLang's HTTP API).

These are contract tests between two parts of rayspec: the twin's SSE format, meta_info and
failure modes must be what the client expects from real SGLang. ``--twin-realtime false`` skips
the twin's pacing, so each test takes about a second.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from rayspec import FailureReason
from rayspec.bench import BenchPlan
from rayspec.bench import Scenario
from rayspec.bench import failure_of
from rayspec.bench import fetch_server_view
from rayspec.bench import first_failure
from rayspec.bench import run_benchmark_detailed
from rayspec.bench import summarize
from rayspec.testing import eagle3_flags

twin_testing = pytest.importorskip("rayspec.testing._twin")

EAGLE = ["--tp-size", "8", *eagle3_flags(2), "--twin-realtime", "false"]


@pytest.fixture(scope="module")
def twin_url() -> Iterator[str]:
    with twin_testing.TwinProcess([*EAGLE, "--enable-metrics"]) as twin:
        twin.wait_ready(60)
        yield twin.base_url


@pytest.mark.parametrize("endpoint", ["generate", "completions"])
def test_twin_records(twin_url: str, endpoint: str) -> None:
    plan = BenchPlan(
        scenarios=(
            Scenario("c1", max_tokens=60),
            Scenario("c4", concurrency=4, requests_per_run=8, max_tokens=30),
        ),
        repeats=2,
        endpoint=endpoint,
    )
    result = run_benchmark_detailed(twin_url, plan)
    assert result.stopped == "" and first_failure(result.records) is None
    for rec in result.records:
        assert rec.completion_tokens == (60 if rec.scenario == "c1" else 30)
        assert rec.prompt_tokens > 0
        assert rec.spec_verify_ct is not None
        assert 1.0 <= (rec.accept_length or 0) <= 3.0  # at most N = 3 tokens per verify cycle
        # SGLang's spec_correct_drafts_histogram: verify steps by drafts accepted (0..N-1)
        assert rec.accept_histogram is not None and 1 <= len(rec.accept_histogram) <= 3
        assert sum(rec.accept_histogram) == rec.spec_verify_ct
        assert 0 < len(rec.itl_ms) < rec.completion_tokens
        assert rec.ttft_ms <= rec.e2e_ms
    for name in ("c1", "c4"):
        stats = summarize(result.records, name)
        assert stats["runs"] == 2.0 and stats["tok_s_mean"] > 0
        assert 1.0 < stats["accept_length"] < 3.0
    view = fetch_server_view(twin_url)
    assert view["server_info"] is not None
    assert "sglang:spec_accept_length" in view["metrics"]


def test_twin_crash_mid_benchmark() -> None:
    with twin_testing.TwinProcess([*EAGLE, "--twin-fault", "crash-after:150"]) as twin:
        twin.wait_ready(60)
        plan = BenchPlan(scenarios=(Scenario("c1", max_tokens=100),), repeats=3)
        result = run_benchmark_detailed(twin.base_url, plan)
    assert result.stopped == "error"
    failed = [r for r in result.records if not r.ok]
    assert failed and failure_of(failed[0]) is FailureReason.CRASH_MID_BENCHMARK
    assert result.first_failure() is not None


def test_twin_stall() -> None:
    with twin_testing.TwinProcess([*EAGLE, "--twin-fault", "stall:150"]) as twin:
        twin.wait_ready(60)
        plan = BenchPlan(
            scenarios=(Scenario("c1", max_tokens=100),), repeats=3, read_timeout_s=0.5
        )
        result = run_benchmark_detailed(twin.base_url, plan)
    assert result.stopped == "error"
    reason, _ = result.first_failure() or (None, "")
    assert reason is FailureReason.STALLED_STREAM
