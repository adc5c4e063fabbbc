"""The streaming client against the paced fake server: timing extraction and failures."""

from __future__ import annotations

import asyncio
import itertools
import math
from typing import Any

import pytest

from rayspec import BenchError
from rayspec import FailureReason
from rayspec import StreamStalled
from rayspec.bench import StreamClient
from rayspec.bench import failure_of
from rayspec.bench._client import _Timeline
from rayspec.testing._fake_server import FakeBehaviour
from rayspec.testing._fake_server import FakeSGLangServer

# pattern (2, 1, 3) after a 1-token first chunk, 20 tokens: the last chunk is cut to 1 token.
PATTERN_CHUNKS = [1, 2, 1, 3, 2, 1, 3, 2, 1, 3, 1]
TOL_S = 0.1  # generous: loopback plus scheduling jitter on a busy CI box


def _stream(url: str, endpoint: str = "generate", max_tokens: int = 20, **kw: float):
    async def go():
        async with StreamClient(url, endpoint=endpoint, **kw) as client:
            return await client.stream("one two three", max_tokens)

    return asyncio.run(go())


def _measure(url: str, endpoint: str = "generate", max_tokens: int = 20, **kw: Any):
    async def go():
        async with StreamClient(url, endpoint=endpoint, **kw) as client:
            return await client.measure(
                "one two three", max_tokens, scenario="s", run=2, index=3, concurrency=1
            )

    return asyncio.run(go())


def test_timeline_splits_chunk_gaps_evenly() -> None:
    tl = _Timeline(t0=10.0)
    tl.advance(10.5, 1)  # first token: TTFT 0.5
    tl.advance(10.7, 3)  # 2 tokens, 0.2 s gap -> 0.1 each
    tl.advance(10.7, 3)  # no new token: ignored
    tl.advance(11.0, 4)
    assert tl.ttft_s == pytest.approx(0.5)
    assert tl.itl_s == pytest.approx([0.1, 0.1, 0.3])
    assert tl.tokens == 4


@pytest.mark.parametrize("endpoint", ["generate", "completions"])
def test_timings_match_server_emission(fake_server: FakeSGLangServer, endpoint: str) -> None:
    fake_server.set_behaviour(FakeBehaviour(ttft_s=0.05, gap_s=0.02, pattern=(2, 1, 3)))
    res = _stream(fake_server.base_url, endpoint)
    (em,) = fake_server.log
    assert em.tokens == list(itertools.accumulate(PATTERN_CHUNKS))
    assert res.completion_tokens == 20
    assert res.prompt_tokens == 3
    assert res.spec_verify_ct == len(PATTERN_CHUNKS) - 1
    # TTFT: the first chunk arrives after it was emitted, and not long after.
    first_arrival = res.t0 + res.ttft_s
    assert res.ttft_s >= 0.05
    assert em.emit_s[0] <= first_arrival <= em.emit_s[0] + TOL_S
    # ITL: one value per token after the first chunk, each chunk's gap split evenly.
    assert len(res.itl_s) == 19
    groups = [len(list(g)) for _, g in itertools.groupby(res.itl_s)]
    assert groups == PATTERN_CHUNKS[1:]
    last_arrival = first_arrival + sum(res.itl_s)
    assert em.emit_s[-1] <= last_arrival + 1e-6 <= em.emit_s[-1] + TOL_S
    assert sum(res.itl_s) == pytest.approx(em.emit_s[-1] - em.emit_s[0], abs=TOL_S)
    assert res.e2e_s >= em.emit_s[-1] - res.t0
    assert res.e2e_s == pytest.approx(0.05 + 0.02 * 10, abs=TOL_S)


@pytest.mark.parametrize("endpoint", ["generate", "completions"])
def test_measure_fills_record(fake_server: FakeSGLangServer, endpoint: str) -> None:
    fake_server.set_behaviour(FakeBehaviour(ttft_s=0.01, gap_s=0.005, pattern=(2, 1, 3)))
    rec = _measure(fake_server.base_url, endpoint)
    assert rec.ok and rec.error is None
    assert (rec.scenario, rec.run, rec.index, rec.concurrency) == ("s", 2, 3, 1)
    assert rec.completion_tokens == 20 and rec.prompt_tokens == 3
    assert rec.spec_verify_ct == 10
    assert rec.accept_length == pytest.approx(2.0)
    assert len(rec.itl_ms) == 19
    assert 10.0 <= rec.ttft_ms < rec.e2e_ms
    assert rec.tpot_ms == pytest.approx((rec.e2e_ms - rec.ttft_ms) / 19)
    assert rec.start_unix_s > 1.6e9


def test_no_speculation_gives_no_accept_length(fake_server: FakeSGLangServer) -> None:
    fake_server.set_behaviour(FakeBehaviour(ttft_s=0.0, gap_s=0.001, spec=False))
    rec = _measure(fake_server.base_url, max_tokens=10)
    assert rec.ok and rec.completion_tokens == 10
    assert rec.spec_verify_ct is None and rec.accept_length is None


def test_stall_raises_stream_stalled(fake_server: FakeSGLangServer) -> None:
    fake_server.set_behaviour(
        FakeBehaviour(ttft_s=0.0, gap_s=0.005, stall_after_chunks=4, stall_s=2.0)
    )
    with pytest.raises(StreamStalled, match="no chunk for 0.3 s after 4 tokens") as info:
        _stream(fake_server.base_url, read_timeout_s=0.3)
    assert info.value.reason is FailureReason.STALLED_STREAM


def test_stall_is_recorded(fake_server: FakeSGLangServer) -> None:
    fake_server.set_behaviour(
        FakeBehaviour(ttft_s=0.0, gap_s=0.005, stall_after_chunks=4, stall_s=2.0)
    )
    rec = _measure(fake_server.base_url, read_timeout_s=0.3)
    assert not rec.ok
    assert rec.failure is FailureReason.STALLED_STREAM and failure_of(rec) is rec.failure
    assert rec.error is not None and not rec.error.startswith(FailureReason.STALLED_STREAM.value)
    assert rec.completion_tokens == 4 and len(rec.itl_ms) == 3
    assert rec.e2e_ms >= 300.0


def test_timeout_after_done_loses_nothing(fake_server: FakeSGLangServer) -> None:
    # [DONE] arrived but the server kept the response open: the request still succeeded.
    fake_server.set_behaviour(FakeBehaviour(ttft_s=0.0, gap_s=0.002, hang_after_done_s=3.0))
    rec = _measure(fake_server.base_url, max_tokens=10, read_timeout_s=1.0)
    assert rec.ok and rec.completion_tokens == 10
    (em,) = fake_server.log
    # The end is the [DONE] chunk, not the read timeout one second later (the request was
    # sent before the server received it, so recv_s + e2e bounds the client's end from above).
    assert em.recv_s + rec.e2e_ms / 1000.0 < em.emit_s[-1] + 0.5


def test_deadline_is_a_stall(fake_server: FakeSGLangServer) -> None:
    fake_server.set_behaviour(FakeBehaviour(ttft_s=0.0, gap_s=0.05))
    with pytest.raises(StreamStalled, match="deadline"):
        _stream(fake_server.base_url, max_tokens=100, request_timeout_s=0.3)


def test_cut_connection_is_a_crash(fake_server: FakeSGLangServer) -> None:
    fake_server.set_behaviour(FakeBehaviour(ttft_s=0.0, gap_s=0.005, cut_after_chunks=3))
    with pytest.raises(BenchError, match="connection .* lost after 3 tokens") as info:
        _stream(fake_server.base_url)
    assert info.value.reason is FailureReason.CRASH_MID_BENCHMARK
    rec = _measure(fake_server.base_url)
    assert failure_of(rec) is FailureReason.CRASH_MID_BENCHMARK
    assert "RemoteProtocolError" in (rec.error or "")
    assert rec.completion_tokens == 3


def test_refused_connection_is_a_crash(closed_port_url: str) -> None:
    rec = _measure(closed_port_url)
    assert failure_of(rec) is FailureReason.CRASH_MID_BENCHMARK
    assert "ConnectError" in (rec.error or "")
    assert math.isnan(rec.ttft_ms) and rec.completion_tokens == 0


def test_error_chunk(fake_server: FakeSGLangServer) -> None:
    fake_server.set_behaviour(FakeBehaviour(ttft_s=0.0, gap_s=0.001, error_after_chunks=2))
    with pytest.raises(BenchError, match="error chunk.*fake failure") as info:
        _stream(fake_server.base_url)
    assert info.value.reason is FailureReason.UNKNOWN
    assert not isinstance(info.value, StreamStalled)


@pytest.mark.parametrize("endpoint", ["generate", "completions"])
def test_malformed_chunk_is_a_recorded_error(fake_server: FakeSGLangServer, endpoint: str) -> None:
    fake_server.set_behaviour(FakeBehaviour(ttft_s=0.0, gap_s=0.001, garbage_after_chunks=2))
    rec = _measure(fake_server.base_url, endpoint)
    assert failure_of(rec) is FailureReason.UNKNOWN
    assert "malformed SSE chunk" in (rec.error or "")
    assert rec.completion_tokens == 2


@pytest.mark.parametrize("endpoint", ["generate", "completions"])
def test_http_error_status(fake_server: FakeSGLangServer, endpoint: str) -> None:
    fake_server.set_behaviour(FakeBehaviour(status=400))
    rec = _measure(fake_server.base_url, endpoint)
    assert failure_of(rec) is FailureReason.UNKNOWN
    assert "HTTP 400" in (rec.error or "") and "fake status" in (rec.error or "")


def test_a_request_failure_is_typed_not_read_from_its_text() -> None:
    import dataclasses

    from rayspec import RequestRecord

    ok = RequestRecord("s", 0, 0, 1, 0, 0, 0.0, 0.0, (), 0.0)
    assert ok.ok and ok.failure is None and failure_of(ok) is None
    # The class is the field, whatever the message says.
    rec = dataclasses.replace(ok, error="stalled_stream: a stall?", failure="out_of_memory")
    assert rec.failure is FailureReason.OUT_OF_MEMORY and not rec.ok
    # A message alone is an unknown failure; a class alone gets its name as the message.
    assert dataclasses.replace(ok, error="boom").failure is FailureReason.UNKNOWN
    crash = dataclasses.replace(ok, failure=FailureReason.CRASH_MID_BENCHMARK)
    assert crash.error == "crash_mid_benchmark" and not crash.ok


def test_client_validates_arguments() -> None:
    with pytest.raises(ValueError, match="endpoint"):
        StreamClient("http://127.0.0.1:1", endpoint="responses")
    with pytest.raises(ValueError, match="max_streams"):
        StreamClient("http://127.0.0.1:1", max_streams=0)


def test_generate_chunk_fast_parse() -> None:
    import json

    from rayspec.bench._client import _parse_generate_chunk

    meta = {"completion_tokens": 3, "finish_reason": None, "prompt_tokens": 4}
    tricky = {
        "text": 'He said "meta_info": {"completion_tokens": 99}',
        "output_ids": [1, 2, 3],
        "meta_info": meta,
    }
    for dumps in (json.dumps, lambda o: json.dumps(o, separators=(",", ":"))):
        assert _parse_generate_chunk(dumps(tricky).encode())["meta_info"] == meta
    # meta_info first, then the cumulative fields: still only the real key matches.
    first = {"meta_info": meta, "text": "x", "output_ids": [1]}
    assert _parse_generate_chunk(json.dumps(first).encode())["meta_info"] == meta
    # No usable meta_info: a full parse (errors and odd chunks keep every field).
    err = {"error": {"message": "boom"}}
    assert _parse_generate_chunk(json.dumps(err).encode()) == err
    odd = {"output_ids": [1, 2], "meta_info": {"id": "a"}}
    assert _parse_generate_chunk(json.dumps(odd).encode()) == odd


def test_the_twin_clock_is_refused_without_the_twins_field(fake_server) -> None:
    """clock='twin' never falls back to the wall clock: a server that is not the twin (no
    ``meta_info.rayspec_twin``) fails the request with a line saying so; the wall clock (the
    default, and always for a real server) measures it."""
    rec = _measure(fake_server.base_url, clock="twin")
    assert not rec.ok and "meta_info.rayspec_twin" in (rec.error or "")
    assert _measure(fake_server.base_url).ok
    with pytest.raises(ValueError, match="endpoint='generate'"):
        StreamClient(fake_server.base_url, endpoint="completions", clock="twin")
