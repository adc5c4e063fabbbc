"""Output budgets on the twin (issue 33, medium 5 and a low): a budget past the context length
and a negative one are refused as SGLang 0.5.23 refuses them (each in its layer's shape, as
the real server answered on this CPU); a long budget costs nothing before it is generated,
and a stop string is looked for in O(1) per token, so the event loop is never held."""

from __future__ import annotations

import asyncio
import json
import tracemalloc
from typing import Any

from tests.twin_tests._inproc import LagProbe
from tests.twin_tests._inproc import build
from tests.twin_tests._inproc import serving

FAST = ("--twin-realtime", "false")
PAST = 5_000_000  # the budget: 6 s of a blocked loop and +200 MB before
MESSAGES = [{"role": "user", "content": "tell me a long story"}]


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _json(client: Any, path: str, body: Any) -> tuple[int, Any]:
    resp = await client.post(path, json=body)
    return resp.status, json.loads(await resp.read())


def test_a_budget_past_the_context_is_refused_as_sglang_does() -> None:
    async def go() -> None:
        async with serving(FAST) as (server, client):
            context = server.context_length
            status, body = await _json(client, "/generate", {
                "text": "a b c", "sampling_params": {"max_new_tokens": PAST}})  # fmt: skip
            assert status == 400
            message = body["error"]["message"]
            assert message.startswith("Requested token count exceeds the model's maximum "
                                      f"context length of {context} tokens")  # fmt: skip
            assert f"a total of {PAST + 3} tokens: 3 tokens from the input" in message
            # Streamed, SGLang has started the stream: 200, one error chunk, [DONE].
            past = {"max_new_tokens": PAST}
            resp = await client.post(
                "/generate", json={"text": "a b c", "stream": True, "sampling_params": past}
            )
            assert resp.status == 200
            lines = [ln for ln in (await resp.text()).split("\n") if ln.startswith("data: ")]
            error = json.loads(lines[0][6:])["error"]
            assert error["code"] == 400 and error["type"] == "invalid_request_error"
            assert lines[1:] == ["data: [DONE]"]
            for path, extra in (("/v1/completions", {"prompt": "a b c"}),
                                ("/v1/chat/completions", {"messages": MESSAGES})):  # fmt: skip
                for stream in (False, True):  # refused before any stream starts
                    status, body = await _json(client, path, {
                        "model": "m", "max_tokens": PAST, "stream": stream, **extra})  # fmt: skip
                    assert status == 400 and body["type"] == "BadRequestError", body
                    assert body["object"] == "error" and "context length" in body["message"]
            # At the limit it is served: prompt + budget == context.
            status, body = await _json(client, "/generate", {"text": "a b c", "sampling_params": {
                "max_new_tokens": context - 3, "ignore_eos": True, "stop": "ka"}})  # fmt: skip
            assert status == 200 and body["meta_info"]["finish_reason"]["type"] == "stop"

    _run(go())


def test_a_negative_budget_is_refused() -> None:
    async def go() -> None:
        async with serving(FAST) as (_, client):
            status, body = await _json(client, "/generate", {
                "text": "x", "sampling_params": {"max_new_tokens": -1}})  # fmt: skip
            assert (status, body) == (400, {"error": {
                "message": "max_new_tokens must be at least 0, got -1."}})  # fmt: skip
            status, body = await _json(client, "/v1/chat/completions", {
                "model": "m", "messages": MESSAGES, "max_tokens": -1})  # fmt: skip
            assert (
                status == 400 and body["message"] == "max_new_tokens must be at least 0, got -1."
            )
            # Completions: the request model refuses it (max_tokens must be positive).
            status, body = await _json(client, "/v1/completions", {
                "model": "m", "prompt": "x", "max_tokens": -1})  # fmt: skip
            assert status == 400 and body["type"] == "Bad Request"
            assert "max_tokens must be positive" in body["message"]

    _run(go())


def test_a_prompt_longer_than_the_context_is_refused() -> None:
    async def go() -> None:
        async with serving([*FAST, "--context-length", "16"]) as (_, client):
            long = {"text": " ".join(["w"] * 20), "sampling_params": {"max_new_tokens": 1}}
            status, body = await _json(client, "/generate", long)
            assert status == 400
            assert body["error"]["message"] == (
                "The input (20 tokens) is longer than the model's context length (16 tokens)."
            )

    _run(go())


def test_a_budget_costs_nothing_before_it_is_generated() -> None:
    server = build([*FAST, "--context-length", str(2 * PAST)])
    req = server.submit("a b c", 3, PAST)
    assert req.max_new_tokens == PAST and req.output_ids == []  # was a 5,000,000-id list


def test_a_long_budget_with_a_stop_string_never_holds_the_loop() -> None:
    """5,000,000 tokens allowed, a stop string never found: the loop's longest stall stays
    under 100 ms and memory grows only with what was generated (before: the whole output and a
    rescan of its text per token, 6 s and +200 MB up front, quadratic with a stop string)."""

    async def go() -> tuple[float, int, int]:
        async with serving([*FAST, "--context-length", str(2 * PAST)]) as (server, client):
            tracemalloc.start()
            try:
                with LagProbe() as probe:
                    params = {"max_new_tokens": PAST, "ignore_eos": True, "stop": ["zz-nope"]}
                    body = {"text": "a b c", "sampling_params": params}
                    pending = asyncio.ensure_future(client.post("/generate", json=body))
                    while server.engine.stats.generated_tokens < 20_000:
                        await asyncio.sleep(0.01)
                    pending.cancel()
                    await asyncio.gather(pending, return_exceptions=True)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            return probe.max_lag_s, peak, server.engine.stats.generated_tokens

    lag_s, peak, generated = _run(go())
    assert generated >= 20_000
    assert lag_s < 0.1, f"the event loop was held {lag_s * 1000:.0f} ms of CPU"
    assert peak < 64 * 2**20, f"{peak / 2**20:.0f} MiB traced for {generated:,} tokens"
