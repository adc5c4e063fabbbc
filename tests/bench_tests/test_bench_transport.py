"""The stream client driven through its ``transport=`` seam: canned SGLang answers, no server.

The chunks are SGLang 0.5.23's ``POST /generate`` stream as recorded in
``tests/data/sglang-0.5.23-dialect.json`` (same keys and value types; the values are made up):
cumulative ``output_ids``/``text``, ``meta_info.completion_tokens`` growing by more than one
under speculation, and a final chunk with ``finish_reason`` and the speculative counters.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from typing import Any

import httpx

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
