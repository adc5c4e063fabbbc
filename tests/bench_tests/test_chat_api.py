"""``bench.api: chat``: the benchmark through ``/v1/chat/completions`` (streaming, OpenAI
format), against canned SGLang chunks and against the twin."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from rayspec import Candidate
from rayspec import SpecSettings
from rayspec._config import load_config
from rayspec._exceptions import ConfigError
from rayspec._types import RequestRecord
from rayspec.bench import StreamClient
from rayspec.bench import request_input
from rayspec.bench import run_benchmark_detailed
from rayspec.testing._twin import TwinProcess
from rayspec.tune._trial import bench_plan
from rayspec.twin._simulate import SimulatedServer
from rayspec.twin._text import count_prompt_tokens
from tests.bench_tests.test_bench_transport import _Canned
from tests.bench_tests.test_bench_transport import _sse
from tests.helpers import TWIN_EXPERIMENT
from tests.twin_tests.test_simulate import LL_SYS
from tests.twin_tests.test_simulate import _argv

HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}


def _chunk(delta: dict[str, Any], finish: str | None = None, done: int | None = None) -> dict:  # type: ignore[type-arg]
    choice = {"index": 0, "delta": {"reasoning_content": None, **delta}, "logprobs": None,
              "finish_reason": finish, "matched_stop": None}  # fmt: skip
    out: dict[str, Any] = {**HEAD, "choices": [choice]}
    if done is not None:
        out["usage"] = {"prompt_tokens": 9, "completion_tokens": done, "total_tokens": 9 + done}
    return out


# SGLang's chat stream: the role first, content with continuous usage (3 tokens at once under
# speculation), the finish in a chunk of its own, sglext, then the usage chunk.
CHAT = [
    _chunk({"role": "assistant", "content": ""}),
    _chunk({"content": " The"}, done=1),
    _chunk({"content": " red model."}, done=4),
    _chunk({}, finish="length"),
    {**HEAD, "choices": [], "usage": None,
     "sglext": {"spec_tokens_details": {"spec_verify_ct": 2,
                                        "spec_correct_drafts_histogram": [1, 0, 1]}}},
    {**HEAD, "choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4}},
]  # fmt: skip


def _chat(send_category: bool) -> tuple[RequestRecord, dict[str, Any], str]:
    handler = _Canned(_sse(CHAT))

    async def go() -> RequestRecord:
        async with StreamClient(
            "http://c.test", endpoint="chat", send_category=send_category,
            transport=httpx.MockTransport(handler),
        ) as client:  # fmt: skip
            return await client.measure(
                "Hi", 4, scenario="s", run=0, index=0, concurrency=1, category="chat"
            )

    record = asyncio.run(go())
    (request,) = handler.seen
    return record, json.loads(request.content), request.url.path


def test_a_chat_stream_becomes_its_record() -> None:
    record, body, path = _chat(send_category=False)
    assert path == "/v1/chat/completions"
    assert body["messages"] == [{"role": "user", "content": "Hi"}] and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["max_tokens"] == 4 and "rayspec_category" not in body
    assert record.ok and record.completion_tokens == 4 and record.prompt_tokens == 9
    assert record.spec_verify_ct == 2 and record.accept_length == 2.0
    assert record.accept_histogram == (1, 0, 1)
    assert len(record.itl_ms) == 3 and record.category == "chat"


def test_the_category_rides_on_a_chat_request_to_the_twin() -> None:
    _record, body, _path = _chat(send_category=True)
    assert body["rayspec_category"] == "chat"


def test_bench_api_picks_the_endpoint_and_the_twin_clock_needs_generate() -> None:
    chat = bench_plan(load_config(TWIN_EXPERIMENT, ["bench.api=chat"]))
    assert (chat.endpoint, chat.clock, chat.send_category) == ("chat", "wall", True)
    native = bench_plan(load_config(TWIN_EXPERIMENT))
    assert (native.endpoint, native.clock, native.send_category) == ("generate", "twin", True)
    with pytest.raises(ConfigError, match=r"bench\.api: .*'completions'.*generate, chat"):
        load_config(TWIN_EXPERIMENT, ["bench.api=completions"])


def test_the_twin_serves_a_chat_benchmark_with_the_categories_acceptance() -> None:
    """Through the twin's /v1/chat/completions: every request measured, with its accept length,
    and the same tokens and verify steps as the simulation draws for its category."""
    cfg = load_config(
        TWIN_EXPERIMENT,
        ["bench.api=chat", "bench.prompts=mixed", "bench.max_tokens=100", "bench.repeats=4"],
    )
    args, env = _argv(cfg, Candidate(nccl_env=LL_SYS, spec=SpecSettings("EAGLE3", 3, 1, 4)))
    plan = bench_plan(cfg)
    with TwinProcess([*args, "--twin-realtime", "false"], env=env) as twin:
        twin.wait_ready()
        served = run_benchmark_detailed(twin.base_url, plan).records
    sim = SimulatedServer(args, env)
    assert len(served) == 5 and all(r.ok for r in served)
    for rec in served:
        ask = request_input(plan.scenarios[0], rec.run, rec.index)
        got = sim.generate(count_prompt_tokens(ask.prompt), ask.max_tokens, None, ask.category)
        assert rec.completion_tokens == got.completion_tokens == 100
        assert rec.spec_verify_ct == got.verify_ct and rec.accept_length is not None
    assert len({r.category for r in served}) > 1
