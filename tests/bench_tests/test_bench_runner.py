"""run_benchmark against the fake server: flush, warm-up, runs, concurrency, stops, server view."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from rayspec import BenchError
from rayspec import FailureReason
from rayspec import StreamStalled
from rayspec.bench import BenchPlan
from rayspec.bench import BenchResult
from rayspec.bench import RunReport
from rayspec.bench import Scenario
from rayspec.bench import Shard
from rayspec.bench import fetch_server_view
from rayspec.bench import first_failure
from rayspec.bench import flush_cache
from rayspec.bench import parse_metrics
from rayspec.bench import raise_for_failure
from rayspec.bench import request_input
from rayspec.bench import run_benchmark
from rayspec.bench import run_benchmark_detailed
from rayspec.bench import run_tok_s
from rayspec.bench import summarize
from rayspec.testing._fake_server import FakeBehaviour
from rayspec.testing._fake_server import FakeSGLangServer

FAST = FakeBehaviour(ttft_s=0.005, gap_s=0.002, pattern=(2, 1))


def _max_overlap(server: FakeSGLangServer) -> int:
    events = sorted(
        [(e.recv_s, 1) for e in server.log] + [(e.emit_s[-1], -1) for e in server.log],
        key=lambda x: (x[0], x[1]),
    )
    level = best = 0
    for _, step in events:
        level += step
        best = max(best, level)
    return best


def test_field_protocol_shape(fake_server: FakeSGLangServer) -> None:
    fake_server.set_behaviour(
        FakeBehaviour(ttft_s=0.005, gap_s=0.002, pattern=(2, 1), flush_busy=2)
    )
    plan = BenchPlan(scenarios=(Scenario("c1", max_tokens=30),), repeats=3)
    seen: list[RunReport] = []
    result = run_benchmark_detailed(fake_server.base_url, plan, on_run_done=seen.append)
    assert result.stopped == ""
    assert [(r.run, r.index) for r in result.records] == [(-1, 0), (0, 0), (1, 0), (2, 0)]
    assert all(r.ok and r.completion_tokens == 30 for r in result.records)
    assert [r.run for r in seen] == [0, 1, 2]  # callback only for measured runs
    assert [r.run for r in result.runs] == [-1, 0, 1, 2]
    assert fake_server.flush_calls == 3  # two busy answers, then flushed
    # the prompts sent are the deterministic selection
    s = plan.scenarios[0]
    assert [e.prompt for e in fake_server.log] == [
        request_input(s, run, 0).prompt for run in (-1, 0, 1, 2)
    ]
    for report in seen:
        assert report.tok_s == pytest.approx(30 / (report.records[0].e2e_ms / 1000))
        assert report.wall_s > 0 and report.client_cpu_s >= 0
    stats = summarize(result.records, "c1")
    assert stats["runs"] == 3.0 and stats["accept_length"] == pytest.approx(30 / 19)
    # One keep-alive connection serves every request (a response left unread would close it).
    assert len({e.peer_port for e in fake_server.log}) == 1


def test_closed_loop_concurrency(fake_server: FakeSGLangServer) -> None:
    fake_server.set_behaviour(FakeBehaviour(ttft_s=0.08, gap_s=0.005, pattern=(1,)))
    plan = BenchPlan(
        scenarios=(Scenario("c4", concurrency=4, requests_per_run=10, max_tokens=8),),
        warmup=0,
        repeats=1,
        flush_cache=False,
    )
    records = run_benchmark(fake_server.base_url, plan)
    assert sorted(r.index for r in records) == list(range(10))
    assert all(r.ok and r.concurrency == 4 for r in records)
    assert _max_overlap(fake_server) == 4
    assert fake_server.flush_calls == 0
    assert len({e.peer_port for e in fake_server.log}) == 4  # 4 connections, each reused


def test_warmup_opens_every_connection(fake_server: FakeSGLangServer) -> None:
    fake_server.set_behaviour(FAST)
    plan = BenchPlan(
        scenarios=(Scenario("c3", concurrency=3, requests_per_run=3, max_tokens=4),), repeats=1
    )
    records = run_benchmark(fake_server.base_url, plan)
    assert [r.run for r in records].count(-1) == 3
    warm_ports = {e.peer_port for e in fake_server.log[:3]}
    assert len(warm_ports) == 3
    assert {e.peer_port for e in fake_server.log[3:]} == warm_ports


def test_poisson_arrivals(fake_server: FakeSGLangServer) -> None:
    fake_server.set_behaviour(FAST)
    plan = BenchPlan(
        scenarios=(
            Scenario("p", concurrency=2, requests_per_run=6, max_tokens=4, request_rate=100.0),
        ),
        warmup=1,
        repeats=1,
    )
    records = run_benchmark(fake_server.base_url, plan)
    assert len(records) == 2 + 6 and all(r.ok for r in records)  # 2 warm-ups at concurrency 2
    assert _max_overlap(fake_server) <= 2
    measured = sorted(e.recv_s for e in fake_server.log[2:])
    assert measured[-1] - measured[0] > 0.005  # arrivals are spread, not a burst


def test_completions_endpoint(fake_server: FakeSGLangServer) -> None:
    fake_server.set_behaviour(FAST)
    plan = BenchPlan(
        scenarios=(Scenario("oai", max_tokens=12),), repeats=2, endpoint="completions"
    )
    records = run_benchmark(fake_server.base_url, plan)
    assert all(r.ok and r.completion_tokens == 12 and r.spec_verify_ct for r in records)
    assert {e.endpoint for e in fake_server.log} == {"completions"}


def test_crash_stops_and_is_classified(fake_server: FakeSGLangServer) -> None:
    fake_server.set_behaviour(FakeBehaviour(ttft_s=0.0, gap_s=0.002, cut_after_chunks=2))
    plan = BenchPlan(scenarios=(Scenario("c1", max_tokens=20),), repeats=3)
    result = run_benchmark_detailed(fake_server.base_url, plan)
    assert result.stopped == "error"
    assert len(result.records) == 1  # the warm-up failed: nothing else was sent
    reason, text = result.first_failure() or (None, "")
    assert reason is FailureReason.CRASH_MID_BENCHMARK and "lost after 2 tokens" in text
    with pytest.raises(BenchError) as info:
        raise_for_failure(result.records)
    assert info.value.reason is FailureReason.CRASH_MID_BENCHMARK
    # Without stop_on_error every run is attempted and recorded.
    keep_going = BenchPlan(scenarios=plan.scenarios, repeats=3, stop_on_error=False)
    records = run_benchmark(fake_server.base_url, keep_going)
    assert len(records) == 4 and not any(r.ok for r in records)
    assert summarize(records)["requests_failed"] == 3.0


def test_stall_is_raised_as_stream_stalled(fake_server: FakeSGLangServer) -> None:
    fake_server.set_behaviour(
        FakeBehaviour(ttft_s=0.0, gap_s=0.002, stall_after_chunks=3, stall_s=1.5)
    )
    plan = BenchPlan(scenarios=(Scenario("c1", max_tokens=20),), warmup=0, read_timeout_s=0.2)
    records = run_benchmark(fake_server.base_url, plan)
    assert len(records) == 1
    with pytest.raises(StreamStalled):
        raise_for_failure(records)
    raise_for_failure([r for r in records if r.ok])  # nothing failed: no error


def test_callback_can_stop(fake_server: FakeSGLangServer) -> None:
    fake_server.set_behaviour(FAST)
    plan = BenchPlan(scenarios=(Scenario("a", max_tokens=5), Scenario("b", max_tokens=5)))
    result = run_benchmark_detailed(fake_server.base_url, plan, on_run_done=lambda r: r.run >= 1)
    assert result.stopped == "callback"
    assert [(r.scenario, r.run) for r in result.records] == [("a", -1), ("a", 0), ("a", 1)]
    assert first_failure(result.records) is None


def test_flush_busy_too_long_and_unreachable(
    fake_server: FakeSGLangServer, closed_port_url: str
) -> None:
    fake_server.set_behaviour(FakeBehaviour(flush_busy=1000))

    async def go(url: str) -> bool:
        async with httpx.AsyncClient(base_url=url, trust_env=False) as http:
            return await flush_cache(http, retry_s=0.3)

    with pytest.raises(BenchError, match="HTTP 400"):
        asyncio.run(go(fake_server.base_url))
    with pytest.raises(BenchError, match="is the server alive") as info:
        asyncio.run(go(closed_port_url))
    assert info.value.reason is FailureReason.CRASH_MID_BENCHMARK


def test_client_bound_flag() -> None:
    report = RunReport("s", 0, (), wall_s=2.0, client_cpu_s=1.6, tok_s=1.0)
    assert report.client_cpu_fraction == pytest.approx(0.8) and report.client_bound
    calm = RunReport("s", 1, (), wall_s=2.0, client_cpu_s=0.2, tok_s=1.0)
    assert not calm.client_bound
    warm = RunReport("s", -1, (), wall_s=1.0, client_cpu_s=1.0, tok_s=1.0)
    result = BenchResult(records=(), runs=(warm, report, calm))
    assert result.client_bound_runs == 1
    assert result.client_metrics() == {"client_cpu_frac_max": 0.8, "client_bound_runs": 1.0}


def test_server_view(fake_server: FakeSGLangServer, closed_port_url: str) -> None:
    fake_server.set_behaviour(FAST)
    run_benchmark(fake_server.base_url, BenchPlan(scenarios=(Scenario("c1", max_tokens=10),)))
    view = fetch_server_view(fake_server.base_url)
    assert view["avg_spec_accept_length"] == pytest.approx(10 / 6)
    assert view["last_gen_throughput"] == pytest.approx(123.4)
    assert view["server_info"]["version"] == "fake"
    assert view["metrics"]["sglang:spec_accept_length"] == pytest.approx(10 / 6)
    with pytest.raises(BenchError):
        fetch_server_view(closed_port_url)


def test_parse_metrics() -> None:
    text = (
        "# HELP sglang:gen_throughput x\n# TYPE sglang:gen_throughput gauge\n"
        'sglang:gen_throughput{model_name="m",tp_rank="0"} 95.5\n'
        'sglang:gen_throughput{model_name="m",tp_rank="1"} 1.0\n'
        'sglang:e2e_request_latency_seconds_bucket{le="0.1"} 3.0\n'
        "sglang:e2e_request_latency_seconds_sum 4.5\n"
        "sglang:num_running_reqs 2\n"
        "python_gc_objects_collected_total 10\n"
        'sglang:broken{a="b"} nan-ish\n'
    )
    assert parse_metrics(text) == {"sglang:gen_throughput": 95.5, "sglang:num_running_reqs": 2.0}


def test_shard_split() -> None:
    shards = [Shard(k, 3) for k in range(3)]
    assert [s.share(8) for s in shards] == [3, 3, 2]
    assert [s.share(2) for s in shards] == [1, 1, 0]
    assert sorted(i for s in shards for i in range(10) if s.owns(i)) == list(range(10))
    with pytest.raises(ValueError, match="index"):
        Shard(3, 3)


class _ThreadBarrier:
    """RunSync for shards on threads of this process (the Ray version is tested with actors)."""

    def __init__(self, parties: int) -> None:
        import threading

        self._barrier = threading.Barrier(parties, timeout=30)

    def wait(self, key: str) -> bool:
        import threading

        try:
            self._barrier.wait()
        except threading.BrokenBarrierError:
            return False
        return True

    def abort(self) -> None:
        self._barrier.abort()


def test_sharded_run_in_step(fake_server: FakeSGLangServer) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from rayspec.bench import merge_results

    fake_server.set_behaviour(FakeBehaviour(ttft_s=0.08, gap_s=0.005, pattern=(1,)))
    plan = BenchPlan(
        scenarios=(Scenario("c4", concurrency=4, requests_per_run=8, max_tokens=6),), repeats=2
    )
    sync = _ThreadBarrier(2)
    with ThreadPoolExecutor(2) as pool:
        futures = [
            pool.submit(run_benchmark_detailed, fake_server.base_url, plan, shard=Shard(k, 2),
                        sync=sync)
            for k in range(2)
        ]  # fmt: skip
        parts = [f.result(timeout=60) for f in futures]
    assert [r.index for r in parts[0].records if r.run == 0] == [0, 2, 4, 6]
    merged = merge_results(parts, plan)
    assert merged.stopped == ""
    assert [(r.run, r.index) for r in merged.records if r.run >= 0] == [
        (run, i) for run in (0, 1) for i in range(8)
    ]
    assert [r.run for r in merged.runs] == [-1, 0, 1]
    assert all(r.concurrency == 4 for r in merged.records)
    assert fake_server.flush_calls == 1  # only shard 0 flushes
    assert _max_overlap(fake_server) == 4
    assert merged.runs[1].tok_s == pytest.approx(run_tok_s(merged.runs[1].records))


def test_sharded_needs_sync(fake_server: FakeSGLangServer) -> None:
    with pytest.raises(ValueError, match="RunSync"):
        run_benchmark_detailed(fake_server.base_url, BenchPlan(), shard=Shard(0, 2))
