"""The stream client driven through its ``transport=`` seam: canned SGLang answers, no server.

The chunks are SGLang 0.5.23's ``POST /generate`` stream as recorded in
``tests/data/sglang-0.5.23-dialect.json`` (same keys and value types; the values are made up):
cumulative ``output_ids``/``text``, ``meta_info.completion_tokens`` growing by more than one
under speculation, and a final chunk with ``finish_reason`` and the speculative counters.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from rayspec import FailureReason
from rayspec._types import RequestRecord
from rayspec.bench import StreamClient


def _meta(completion: int, **final: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "id": "5a1c0e3f", "finish_reason": None, "prompt_tokens": 7, "weight_version": "default",
        "completion_tokens": completion, "cached_tokens": 0, "reasoning_tokens": 0,
        "cached_tokens_details": {"device": 0, "host": 0}, "dp_rank": None,
        "num_retractions": 0, "queue_time": 0.0004, "forward_entry_time": 1.7e9,
        "prefill_finished_time": 1.7e9, "response_sent_to_client_ts": 1.7e9,
        "storage_prefetch_wait": 0.0, "storage_staging_wait": 0.0,
    }  # fmt: skip
    meta.update(final)
    return meta


IDS = [791, 2579, 1646, 88]
CHUNKS = [
    {"text": " The", "output_ids": IDS[:1], "meta_info": _meta(1)},
    {"text": " The red model", "output_ids": IDS[:3], "meta_info": _meta(3)},  # 2 accepted
    {
        "text": " The red model.",
        "output_ids": IDS,
        "meta_info": _meta(
            4,
            finish_reason={"type": "length", "length": 4},
            e2e_latency=0.052,
            spec_verify_ct=2,
            spec_accept_length=2.0,
            spec_accept_rate=0.5,
            spec_num_correct_drafts=2,
            spec_num_proposed_drafts=4,
            spec_correct_drafts_histogram=[1, 0, 1],
            first_token_latency=0.02,
            decode_throughput=80.0,
        ),  # fmt: skip
    },
]


def _sse(chunks: list[dict[str, Any]], *, done: bool = True) -> list[bytes]:
    events = [b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks]
    return [*events, b"data: [DONE]\n\n"] if done else events


class _Canned:
    """An ``httpx.MockTransport`` handler: answers each request with ``events``, one read
    each, and keeps the requests it saw."""

    def __init__(self, events: list[bytes], status: int = 200) -> None:
        self.events = events
        self.status = status
        self.seen: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)

        async def body() -> AsyncIterator[bytes]:
            for event in self.events:
                yield event

        return httpx.Response(
            self.status, headers={"content-type": "text/event-stream"}, content=body()
        )


def _measure(handler: _Canned, max_tokens: int = 4) -> RequestRecord:
    async def go() -> RequestRecord:
        transport = httpx.MockTransport(handler)
        async with StreamClient("http://sglang.test", transport=transport) as client:
            return await client.measure(
                "The red model", max_tokens, scenario="s", run=1, index=2, concurrency=1
            )

    return asyncio.run(go())


def test_a_canned_sglang_stream_becomes_its_record() -> None:
    handler = _Canned(_sse(CHUNKS))
    record = _measure(handler)
    assert record.failure is None and record.error is None
    assert (record.scenario, record.run, record.index) == ("s", 1, 2)
    assert record.prompt_tokens == 7
    assert record.completion_tokens == 4
    assert len(record.itl_ms) == 3  # the tokens after the first chunk's one
    assert record.ttft_ms >= 0 and record.e2e_ms >= record.ttft_ms
    assert record.spec_verify_ct == 2
    assert record.accept_length == 2.0
    assert record.output_ids == tuple(IDS)
    assert record.accept_histogram == (1, 0, 1)
    (request,) = handler.seen
    assert request.method == "POST" and request.url.path == "/generate"
    body = json.loads(request.content)
    assert body["stream"] is True and body["sampling_params"]["max_new_tokens"] == 4


def test_a_canned_stream_cut_before_its_final_chunk_is_a_crash() -> None:
    record = _measure(_Canned(_sse(CHUNKS[:2], done=False)))
    assert record.failure is FailureReason.CRASH_MID_BENCHMARK
    assert record.completion_tokens == 3  # what arrived before the cut is kept
    assert "without a final chunk" in record.error


def test_a_canned_http_error_is_a_recorded_failure() -> None:
    record = _measure(_Canned([b'{"error": "overloaded"}'], status=503))
    assert record.failure is FailureReason.UNKNOWN
    assert "HTTP 503" in record.error and "overloaded" in record.error
    assert math.isnan(record.ttft_ms)


def _measure_on(handler: _Canned, endpoint: str, clock: str = "wall") -> RequestRecord:
    async def go() -> RequestRecord:
        transport = httpx.MockTransport(handler)
        async with StreamClient(
            "http://sglang.test", transport=transport, endpoint=endpoint, clock=clock
        ) as client:
            return await client.measure(
                "The red model", 12, scenario="s", run=0, index=0, concurrency=1
            )

    return asyncio.run(go())


def _usage(completion: int) -> dict[str, Any]:
    return {"prompt_tokens": 35, "total_tokens": 35 + completion, "completion_tokens": completion,
            "prompt_tokens_details": None, "reasoning_tokens": 0,
            "completion_tokens_details": None}  # fmt: skip


def _chat(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choice = {"index": 0, "delta": {"reasoning_content": None, **delta}, "logprobs": None,
              "finish_reason": finish, "matched_stop": None}  # fmt: skip
    return {"id": "cc1b8badd0994b4fa91c8c6430ec32ec", "object": "chat.completion.chunk",
            "created": 1796640931, "model": "default", "choices": [choice], **extra}  # fmt: skip


def _details() -> dict[str, Any]:
    return {"spec_tokens_details": {
        "spec_accept_rate": 1.0, "spec_accept_length": 4.0, "spec_cap_length": 0.0,
        "spec_block_accept_length": 0.0, "spec_num_correct_drafts": 9,
        "spec_num_proposed_drafts": 9, "spec_verify_ct": 3,
        "spec_correct_drafts_histogram": [0, 0, 0, 3], "spec_cap_lens_histogram": []}}  # fmt: skip


# Real SGLang 0.5.23's chat stream of the always-agreeing pair (12 tokens of token 0, a special
# token with no text; recorded on this CPU): the role, the finish, sglext, usage. No chunk
# carries a token's text, so none carries usage before the last.
TEXTLESS_CHAT = [
    _chat({"role": "assistant", "content": ""}),
    _chat({}, "length"),
    {"id": "cc1b8badd0994b4fa91c8c6430ec32ec", "object": "chat.completion.chunk",
     "created": 1796640931, "model": "default", "choices": [], "usage": None,
     "sglext": _details()},
    {"id": "cc1b8badd0994b4fa91c8c6430ec32ec", "object": "chat.completion.chunk",
     "created": 1796640931, "model": "default", "choices": [], "usage": _usage(12)},
]  # fmt: skip


def test_a_chat_answer_of_tokens_without_text_is_measured() -> None:
    """Issue 33, 11: SGLang sends no chat chunk for tokens without text; the client failed
    such a request ("finished without any token", 4 of 4 warm-ups on the agreeing pair)."""
    record = _measure_on(_Canned(_sse(TEXTLESS_CHAT)), "chat")
    assert record.ok, record.error
    assert record.completion_tokens == 12 and record.prompt_tokens == 35
    assert len(record.itl_ms) == 11  # the first token came with the role, the rest by the end
    assert not math.isnan(record.ttft_ms) and record.ttft_text_ms is None  # no text, ever
    assert record.spec_verify_ct == 3 and record.accept_histogram == (0, 0, 0, 3)


def test_chat_tokens_without_text_count_from_the_next_usage() -> None:
    chunks = [
        _chat({"role": "assistant", "content": ""}),
        _chat({"content": "Hi"}, usage=_usage(3)),  # two tokens before it had no text
        _chat({"content": " there"}, usage=_usage(4)),
        _chat({}, "length"),
        TEXTLESS_CHAT[-1],
    ]
    record = _measure_on(_Canned(_sse(chunks)), "chat")
    assert record.ok and record.completion_tokens == 12
    assert len(record.itl_ms) == 11 and record.ttft_text_ms is not None
    assert record.ttft_text_ms >= record.ttft_ms  # the text came after the first token


def _twin_chunk(text: str, ids: list[int], token_s: float, final: bool = False) -> dict[str, Any]:
    meta = _meta(len(ids), rayspec_twin={"sim_arrival_s": 10.0, "sim_token_s": 10.0 + token_s})
    if final:
        meta["finish_reason"] = {"type": "length", "length": len(ids)}
    return {"text": text, "output_ids": ids, "meta_info": meta}


def test_both_times_to_first_token_are_kept() -> None:
    """Issue 33, 12: ttft_ms is to the first chunk carrying tokens (rayspec's, the report's);
    ttft_text_ms to the first non-empty text, as bench_serving, AIPerf and the openai client
    time it. On the twin's clock both are exact: here 100 ms and 300 ms."""
    pad = 998
    chunks = [
        _twin_chunk("", [pad], 0.1),
        _twin_chunk("", [pad, pad], 0.2),
        _twin_chunk("The", [pad, pad, 1000], 0.3),
        _twin_chunk("The red", [pad, pad, 1000, 1001], 0.4, final=True),
    ]
    record = _measure_on(_Canned(_sse(chunks)), "generate", clock="twin")
    assert record.ok and record.completion_tokens == 4
    assert record.ttft_ms == pytest.approx(100.0)
    assert record.ttft_text_ms == pytest.approx(300.0)
    assert record.itl_ms == pytest.approx((100.0, 100.0, 100.0))


def test_ttft_text_is_stored_beside_ttft(tmp_path: Any) -> None:
    from rayspec.store._parquet import request_record
    from rayspec.store._parquet import request_rows

    record = _measure_on(_Canned(_sse(TEXTLESS_CHAT)), "chat")
    with_text = dataclasses.replace(record, ttft_text_ms=12.5)
    rows = request_rows(3, (record, with_text)).to_pylist()
    assert [r["ttft_text_ms"] for r in rows] == [None, 12.5]
    assert [request_record(r).ttft_text_ms for r in rows] == [None, 12.5]
    assert rows[0]["ttft_ms"] == record.ttft_ms
