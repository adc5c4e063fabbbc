"""BenchActor through the shared local Ray cluster."""

from __future__ import annotations

import pickle
import time

import pytest

from rayspec import RequestRecord
from rayspec.bench import BenchActor
from rayspec.bench import BenchPlan
from rayspec.bench import BenchResult
from rayspec.bench import Scenario
from rayspec.bench import summarize
from rayspec.testing._fake_server import FakeBehaviour
from rayspec.testing._fake_server import FakeSGLangServer


def test_records_survive_pickling() -> None:
    rec = RequestRecord("s", 0, 1, 4, 10, 20, 5.0, 50.0, (1.0, 2.0), 1.7e9, 10, 2.0)
    assert pickle.loads(pickle.dumps(rec)) == rec


def test_bench_actor_runs_a_plan(ray_cluster: None, fake_server: FakeSGLangServer) -> None:
    import ray

    fake_server.set_behaviour(FakeBehaviour(ttft_s=0.005, gap_s=0.002, pattern=(2, 1)))
    actor = BenchActor.remote()
    try:
        env = ray.get(actor.environment.remote(), timeout=60)
        assert env["cuda_visible_devices"] == ""
        plan = BenchPlan(
            scenarios=(Scenario("c2", concurrency=2, requests_per_run=4, max_tokens=10),),
            repeats=2,
        )
        records = ray.get(actor.run.remote(fake_server.base_url, plan), timeout=60)
        assert len(records) == 2 + 2 * 4  # warm-up at concurrency 2: 2 requests
        assert all(isinstance(r, RequestRecord) and r.ok for r in records)
        assert summarize(records)["runs"] == 2.0
        progress = ray.get(actor.progress.remote(), timeout=30)
        assert [p.run for p in progress] == [0, 1]
        view = ray.get(actor.server_view.remote(fake_server.base_url), timeout=30)
        assert view["avg_spec_accept_length"] == pytest.approx(10 / 6)

        # A stop request from the driver ends a long run after its current measured run.
        fake_server.set_behaviour(FakeBehaviour(ttft_s=0.0, gap_s=0.01))
        long_plan = BenchPlan(scenarios=(Scenario("c1", max_tokens=20),), repeats=50)
        ref = actor.run_detailed.remote(fake_server.base_url, long_plan)
        deadline = time.monotonic() + 30
        while not ray.get(actor.progress.remote(), timeout=30):
            assert time.monotonic() < deadline, "no run finished"
            time.sleep(0.05)
        actor.request_stop.remote()
        result = ray.get(ref, timeout=60)
        assert isinstance(result, BenchResult) and result.stopped == "callback"
        assert 1 <= sum(1 for r in result.runs if r.run >= 0) < 50
    finally:
        ray.kill(actor)


def test_run_sharded_over_two_actors(ray_cluster: None, fake_server: FakeSGLangServer) -> None:
    import ray

    from rayspec import FailureReason
    from rayspec.bench import run_sharded

    fake_server.set_behaviour(FakeBehaviour(ttft_s=0.01, gap_s=0.003, pattern=(2, 1)))
    actors = [BenchActor.remote() for _ in range(2)]
    try:
        plan = BenchPlan(
            scenarios=(
                Scenario("c1", max_tokens=10),
                Scenario("c4", concurrency=4, requests_per_run=6, max_tokens=10),
            ),
            repeats=2,
        )
        result = run_sharded(fake_server.base_url, plan, actors)
        assert result.stopped == ""
        assert all(r.ok for r in result.records)
        assert [(r.scenario, r.run) for r in result.runs] == [
            ("c1", -1), ("c1", 0), ("c1", 1), ("c4", -1), ("c4", 0), ("c4", 1),
        ]  # fmt: skip
        assert [r.index for r in result.runs[4].records] == list(range(6))
        assert len(result.runs[1].records) == 1  # concurrency 1: one shard sends, one idles
        assert fake_server.flush_calls == 2  # once per scenario, by shard 0 only
        assert summarize(result.records, "c4")["runs"] == 2.0

        # A crash stops every shard: the failing one aborts the barrier for the others.
        fake_server.set_behaviour(FakeBehaviour(ttft_s=0.0, gap_s=0.002, cut_after_chunks=2))
        crash = run_sharded(fake_server.base_url, plan, actors, sync_timeout_s=30)
        assert crash.stopped == "error"
        reason, _ = crash.first_failure() or (None, "")
        assert reason is FailureReason.CRASH_MID_BENCHMARK
    finally:
        for actor in actors:
            ray.kill(actor)
