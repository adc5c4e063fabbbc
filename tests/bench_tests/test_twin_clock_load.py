"""Under load a twin study is timed by the twin's modelled clock, not by a slow client.

One closed-loop wave of 4 streams through a paced HTTP twin (noise off) while the client is
artificially slowed: every chunk it reads blocks its event loop for 30 ms, so on the wall clock
a stream's chunks are read hundreds of ms apart and an SLO the model meets is missed. On the
twin's clock (``BenchPlan.clock="twin"``, what a twin study uses) the run's TTFT, gaps, tok/s and
goodput are the in-process simulation's of the same wave (the HTTP twin's own scheduler on a
virtual clock), whatever the client's speed.
"""

from __future__ import annotations

import statistics
import time

import pytest

from rayspec import Candidate
from rayspec import SpecSettings
from rayspec._config import load_config
from rayspec.bench import BenchPlan
from rayspec.bench import Scenario
from rayspec.bench import StreamClient
from rayspec.bench import request_input
from rayspec.bench import run_benchmark_detailed
from rayspec.bench import run_tok_s
from rayspec.bench import summarize
from rayspec.bench._slo import request_itl_p99
from rayspec.bench._slo import slo_metrics
from rayspec.testing._twin import TwinProcess
from rayspec.twin._simulate import LoadAsk
from rayspec.twin._simulate import SimulatedServer
from rayspec.twin._text import count_prompt_tokens
from tests.helpers import TWIN_EXPERIMENT
from tests.twin_tests.test_simulate_load import LL_SYS
from tests.twin_tests.test_simulate_load import _http_args
from tests.twin_tests.test_simulate_load import _quiet_profile

STREAMS = 4
TOKENS = 48
CLIENT_STALL_S = 0.03  # per chunk read: a loaded host, as seen by the client
WAVE_ATTEMPTS = 4  # fresh twins until one admits the wave in one prefill batch
STEPS = 2
WALL_ITL_MS = STREAMS * CLIENT_STALL_S * 1000.0 / (STEPS + 1)


def test_a_slow_client_does_not_change_what_a_twin_run_measures(tmp_path, monkeypatch) -> None:
    cfg = load_config(TWIN_EXPERIMENT, [f"server.twin.profile={_quiet_profile(str(tmp_path))}"])
    cand = Candidate(nccl_env=LL_SYS, spec=SpecSettings("EAGLE3", STEPS, 1, STEPS + 1))
    args, env = _http_args(cfg, cand, trial=3)
    sc = Scenario(name="c4", concurrency=STREAMS, requests_per_run=STREAMS, max_tokens=TOKENS)
    asks = [request_input(sc, 0, i) for i in range(STREAMS)]
    sizes = [count_prompt_tokens(a.prompt) for a in asks]
    # The model's figures of this wave: the same scheduler in process, on a virtual clock.
    served = SimulatedServer(args, env).serve([LoadAsk(n, TOKENS) for n in sizes], STREAMS)
    model_ttft = statistics.mean(r.ttft_ms for r in served)
    model_itl = statistics.mean(x for r in served for x in r.itl_ms)
    model_gap = max(float(max(r.itl_ms)) for r in served)
    prefill_ms = SimulatedServer(args, env).model.prefill_ms(sum(sizes))
    # An SLO the model meets with room (a gap may hold the prefill of a stream admitted
    # late); the slowed client reads a stream's chunks hundreds of ms apart on the wall clock.
    slo = {"ttft_p99_ms": 3 * model_ttft, "itl_p99_ms": 1.25 * (model_gap + prefill_ms)}

    slow = StreamClient._on_chunk

    def stalled(self, *a, **kw):  # type: ignore[no-untyped-def]
        time.sleep(CLIENT_STALL_S)  # blocks every stream, as a busy host does
        return slow(self, *a, **kw)

    monkeypatch.setattr(StreamClient, "_on_chunk", stalled)
    plan = BenchPlan(scenarios=(sc,), warmup=0, repeats=1, clock="twin")
    # On a loaded host the four sends can reach the twin around its first prefill, which then
    # admits the wave in two batches: the model's figures are then those of another schedule.
    # A fresh twin (the same request numbering, so the same draws) gets the wave again; the
    # exact comparison needs one attempt whose wave came together.
    for _attempt in range(WAVE_ATTEMPTS):
        with TwinProcess(args, env=env) as twin:
            twin.wait_ready()
            before = twin.log().count("Prefill batch")
            result = run_benchmark_detailed(twin.base_url, plan)
            batches = twin.log().count("Prefill batch") - before
        records = [r for r in result.records if r.run == 0]
        assert len(records) == STREAMS and all(r.ok for r in records)
        assert all(r.sim_start_s is not None for r in records)
        stats = summarize(records, "c4")
        slo_view = slo_metrics(records, slo, "c4")
        seen = f"{batches} prefill batches; model TTFT {model_ttft}, ITL {model_itl}; got {stats}"
        # Every request met the SLO on the twin's clock: goodput is the whole throughput.
        assert slo_view["slo_met_frac"] == 1.0, seen
        assert slo_view["goodput"] == pytest.approx(stats["tok_s_mean"], rel=1e-12), seen
        assert max(request_itl_p99(r) for r in records) <= slo["itl_p99_ms"], seen
        # The slowed client reads a stream's chunks about STREAMS stalls apart, at most
        # steps + 1 tokens a chunk: a wall clock would show WALL_ITL_MS a token or more.
        assert stats["itl_ms_mean"] < WALL_ITL_MS / 2, seen
        if batches == 1:  # the wave reached the engine together: the model's numbers exactly
            assert stats["ttft_ms_mean"] == pytest.approx(model_ttft, rel=1e-9), seen
            # A gap, and tok/s (which spans the run from its first arrival), can hold the
            # microseconds by which a loaded host's arrival reaches the twin later than the
            # in-process wave's (seen: 5e-7 of each).
            assert stats["itl_ms_mean"] == pytest.approx(model_itl, rel=1e-4), seen
            assert stats["tok_s_mean"] == pytest.approx(run_tok_s(_as_records(served)), rel=1e-4)
            return
        # Admitted in k prefills: at most k - 1 more whole-wave prefills of waiting.
        extra = (batches - 1) * prefill_ms
        assert model_ttft <= stats["ttft_ms_mean"] + 1e-6 <= model_ttft + extra + 1e-6, seen
    # Every try split the wave (a host busy for minutes): the bounds above held for each.


def _as_records(served):  # type: ignore[no-untyped-def]
    from rayspec import RequestRecord

    return [
        RequestRecord(
            "c4", 0, i, STREAMS, 0, r.completion_tokens, r.ttft_ms, r.e2e_ms, r.itl_ms, r.sent_s
        )  # fmt: skip
        for i, r in enumerate(served)
    ]
