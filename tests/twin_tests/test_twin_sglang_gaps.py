"""Where the twin differed from SGLang 0.5.23 and no longer does: /tokenize, /detokenize,
/v1/models/{model}, where the stream puts finish_reason and the chat role, how requests end
(end-of-sequence, stop strings and tokens, ignore_eos) and a TP larger than the node's GPUs."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from rayspec._exceptions import FailureReason
from rayspec.server import classify_failure
from rayspec.testing._twin import TwinProcess
from rayspec.twin._ends import Completion
from rayspec.twin._ends import Stops
from rayspec.twin._text import EOS_TOKEN_ID
from rayspec.twin._text import completion_ids
from rayspec.twin._text import detokenize
from rayspec.twin._text import encode
from rayspec.twin._text import word

from .conftest import SPEC_ARGS
from .conftest import StartTwin


@pytest.fixture(scope="module")
def fast() -> Iterator[TwinProcess]:
    """A twin without waiting (same tokens, same ends): long requests in no time."""
    with TwinProcess([*SPEC_ARGS, "--served-model-name", "kimi", "--twin-realtime", "false"]) as t:
        t.wait_ready()
        yield t


@pytest.fixture(scope="module")
def paced() -> Iterator[TwinProcess]:
    """A twin at the model's real pace (for timing)."""
    with TwinProcess([*SPEC_ARGS, "--served-model-name", "kimi"]) as t:
        t.wait_ready()
        yield t


def _events(resp: httpx.Response) -> list[tuple[float, dict]]:  # type: ignore[type-arg]
    out = []
    for line in resp.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append((time.perf_counter(), json.loads(line[6:])))
    return out


def test_tokenize_and_detokenize(fast: TwinProcess) -> None:
    c = httpx.Client(base_url=fast.base_url, timeout=30)
    for path in ("/tokenize", "/v1/tokenize"):
        one = c.post(path, json={"model": "kimi", "prompt": "one two three"}).json()
        assert one["count"] == 3 and len(one["tokens"]) == 3
        assert isinstance(one["max_model_len"], int) and one["max_model_len"] > 0
    many = c.post("/v1/tokenize", json={"prompt": ["a b", "c d e"]}).json()
    assert many["count"] == [2, 3] and [len(t) for t in many["tokens"]] == [2, 3]
    # The count agrees with the prompt_tokens /generate reports for the same text.
    gen = c.post("/generate", json={"text": "one two three", "sampling_params": {
        "max_new_tokens": 4, "ignore_eos": True}}).json()  # fmt: skip
    assert gen["meta_info"]["prompt_tokens"] == 3
    for path in ("/detokenize", "/v1/detokenize"):
        assert c.post(path, json={"tokens": gen["output_ids"]}).json()["text"] == gen["text"]
    both = c.post("/detokenize", json={"tokens": [gen["output_ids"], []]}).json()
    assert both["text"] == [gen["text"], ""]
    assert c.post("/tokenize", json={"prompt": 5}).status_code == 400
    assert c.post("/detokenize", json={"tokens": "x"}).status_code == 400
    assert detokenize(encode(gen["text"])) == gen["text"]


def test_model_card(fast: TwinProcess) -> None:
    c = httpx.Client(base_url=fast.base_url)
    card = c.get("/v1/models/kimi").json()
    assert card["id"] == "kimi" and card["object"] == "model" and card["owned_by"] == "sglang"
    assert card == c.get("/v1/models").json()["data"][0]
    missing = c.get("/v1/models/other")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"
    assert openai.OpenAI(base_url=fast.base_url + "/v1", api_key="x").models.retrieve("kimi").id \
        == "kimi"  # fmt: skip


def test_completions_stream_ends_on_its_last_content_chunk(fast: TwinProcess) -> None:
    body = {
        "model": "kimi",
        "prompt": "Say something long",
        "max_tokens": 30,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream("POST", fast.base_url + "/v1/completions", json=body, timeout=30) as r:
        events = [e for _, e in _events(r)]
    chunks = [e for e in events if e["choices"]]
    assert all(c["choices"][0]["text"] for c in chunks)  # no empty chunk just for the finish
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 30


def test_chat_role_goes_out_with_the_first_token(paced: TwinProcess) -> None:
    body = {
        "model": "kimi",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "stream": True,
    }
    t0 = time.perf_counter()
    with httpx.stream("POST", paced.base_url + "/v1/chat/completions", json=body, timeout=30) as r:
        events = _events(r)
    (t_role, role), (t_first, first) = events[0], events[1]
    assert role["choices"][0]["delta"] == {
        "reasoning_content": None,
        "role": "assistant",
        "content": "",
    }
    assert first["choices"][0]["delta"]["content"]
    ttft = t_first - t0
    assert ttft > 0.02  # the twin's prefill and first step
    assert t_first - t_role < 0.25 * ttft, (t_role - t0, ttft)  # not ahead of the token
    assert events[-1][1]["choices"][0]["finish_reason"] == "length"


def test_end_of_sequence_unless_ignore_eos(fast: TwinProcess) -> None:
    c = httpx.Client(base_url=fast.base_url, timeout=60)
    ask = {"text": "tell me everything", "sampling_params": {"max_new_tokens": 4000}}
    out = c.post("/generate", json=ask).json()
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "stop", "matched": EOS_TOKEN_ID}
    n = meta["completion_tokens"]
    assert 512 <= n < 4000 and len(out["output_ids"]) == n
    assert out["output_ids"][-1] == EOS_TOKEN_ID
    assert len(out["text"].split()) == n - 1  # the EOS token has no text
    ask["sampling_params"]["ignore_eos"] = True
    full = c.post("/generate", json=ask).json()
    assert full["meta_info"]["completion_tokens"] == 4000
    assert full["meta_info"]["finish_reason"] == {"type": "length", "length": 4000}
    assert full["text"].startswith(out["text"])  # the same greedy text, just longer
    # The OpenAI endpoints say "stop" for it.
    client = openai.OpenAI(base_url=fast.base_url + "/v1", api_key="x")
    done = client.completions.create(model="kimi", prompt="tell me everything", max_tokens=4000)
    assert done.choices[0].finish_reason == "stop" and done.usage.completion_tokens == n


def test_stop_strings_and_tokens(fast: TwinProcess) -> None:
    c = httpx.Client(base_url=fast.base_url, timeout=30)
    base = {"text": "stop me", "sampling_params": {"max_new_tokens": 40, "ignore_eos": True}}
    full = c.post("/generate", json=base).json()
    words, ids = full["text"].split(), full["output_ids"]
    word = words[12]
    cut = full["text"].find(word)
    out = c.post("/generate", json={"text": "stop me", "sampling_params": {
        "max_new_tokens": 40, "stop": [word]}}).json()  # fmt: skip
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}
    assert out["text"] == full["text"][:cut]
    assert out["meta_info"]["completion_tokens"] <= 13
    kept = c.post("/generate", json={"text": "stop me", "sampling_params": {
        "max_new_tokens": 40, "stop": word, "no_stop_trim": True}}).json()  # fmt: skip
    assert kept["text"].endswith(word) or word in kept["text"].split()[-1]
    token = ids[7]
    first = ids.index(token)
    by_id = c.post("/generate", json={"text": "stop me", "sampling_params": {
        "max_new_tokens": 40, "stop_token_ids": [token]}}).json()  # fmt: skip
    assert by_id["meta_info"]["finish_reason"] == {"type": "stop", "matched": token}
    assert by_id["meta_info"]["completion_tokens"] == first + 1
    assert by_id["text"] == " ".join(words[:first])  # the matched token's text is trimmed
    late = c.post(
        "/generate",
        json={
            "text": "stop me",
            "sampling_params": {
                "max_new_tokens": 40,
                "stop_token_ids": [token],
                "min_new_tokens": 39,
            },
        },
    ).json()
    assert late["meta_info"]["completion_tokens"] >= 39
    chat = openai.OpenAI(base_url=fast.base_url + "/v1", api_key="x").completions.create(
        model="kimi", prompt="stop me", max_tokens=40, stop=[word]
    )
    assert chat.choices[0].finish_reason == "stop" and chat.choices[0].text == out["text"]
    assert c.post("/generate", json={"text": "x", "sampling_params": {
        "max_new_tokens": 4, "stop_token_ids": ["a"]}}).status_code == 400  # fmt: skip


def _all(completion: Completion, step: int = 3) -> tuple[list[int], dict[str, Any]]:
    """Every id of ``completion`` taken ``step`` at a time, and its finish."""
    ids: list[int] = []
    while True:
        got, ended = completion.take(step)
        ids += got
        if ended:
            assert completion.end is not None
            return ids, completion.end.finish


def test_completion_end_rules() -> None:
    assert _all(Completion(7, "k", 20, Stops(), eos_at=600))[1] == {"type": "length", "length": 20}
    ids, finish = _all(Completion(7, "k", 20, Stops(), eos_at=10))
    assert len(ids) == 10 and ids[-1] == EOS_TOKEN_ID
    assert finish == {"type": "stop", "matched": EOS_TOKEN_ID}
    assert ids[:9] == completion_ids(7, "k", 9)  # the same greedy text up to the end
    ignored = Completion(7, "k", 20, Stops(ignore_eos=True), eos_at=10)
    assert _all(ignored)[1]["type"] == "length"
    late = Completion(7, "k", 20, Stops(min_new_tokens=12), eos_at=10)
    assert len(_all(late)[0]) == 20  # no EOS before the minimum
    assert Stops.from_params({"stop": "x", "min_tokens": 3}) == Stops(("x",), min_new_tokens=3)
    assert _all(Completion(7, "k", 0, Stops()))[0] == []


def _old_plan_end(
    ids: list[int], eos_at: int, max_new_tokens: int, stops: Stops
) -> tuple[int, dict[str, Any], int | None]:
    """The planner the twin had (the whole output built and scanned up front, quadratic):
    the reference the incremental Completion must agree with."""
    eos = not stops.ignore_eos and stops.min_new_tokens < eos_at <= max_new_tokens
    limit = eos_at - 1 if eos else max_new_tokens
    if stops.token_ids or stops.strings:
        longest = max((len(s) for s in stops.strings), default=0)
        text = ""
        for n in range(1, limit + 1):
            token = ids[n - 1]
            start = max(0, len(text) - longest + 1)
            text = f"{text} {word(token)}" if text else word(token)
            if n <= stops.min_new_tokens:
                continue
            if token in stops.token_ids:
                return n, {"type": "stop", "matched": token}, None
            hits = [(text.find(s, start), s) for s in stops.strings if s in text[start:]]
            if hits:
                at, matched = min(hits)
                return n, {"type": "stop", "matched": matched}, at
    if eos:
        return eos_at, {"type": "stop", "matched": EOS_TOKEN_ID}, None
    return max_new_tokens, {"type": "length", "length": max_new_tokens}, None


@settings(max_examples=300, deadline=None)
@given(
    key=st.text(max_size=6),
    budget=st.integers(0, 120),
    eos_at=st.integers(1, 140),
    picks=st.lists(st.tuples(st.integers(0, 119), st.integers(1, 9)), max_size=3),
    min_new=st.integers(0, 30),
    by_token=st.booleans(),
    ignore_eos=st.booleans(),
    step=st.integers(1, 7),
)
def test_the_incremental_end_is_the_old_planners(
    key: str, budget: int, eos_at: int, picks: list[tuple[int, int]], min_new: int,
    by_token: bool, ignore_eos: bool, step: int,
) -> None:  # fmt: skip
    """Stop strings cut from the answer's own words (within and across words), stop tokens,
    EOS, min_new_tokens: the same tokens and the same end as the up-front planner."""
    ids = completion_ids(3, key, 140)
    text = detokenize(ids)
    strings = tuple(text[a % max(1, len(text)) :][:size] for a, size in picks if text)
    tokens = frozenset(ids[a] for a, _ in picks) if by_token else frozenset()
    stops = Stops(tuple(s for s in strings if s), tokens, ignore_eos, min_new)
    n, finish, trim = _old_plan_end(ids, eos_at, budget, stops)
    completion = Completion(3, key, budget, stops, eos_at=eos_at)
    got, got_finish = _all(completion, step) if budget else ([], completion.end.finish)
    assert (len(got), got_finish) == (n, finish)
    assert got[: max(0, n - 1)] == ids[: max(0, n - 1)]
    if trim is not None:
        assert completion.end is not None and completion.end.trim_at == trim


def test_a_stop_string_costs_each_token_the_same() -> None:
    """A stop string never found in a 200,000-token budget: the tokens come in O(1) each (the
    planner before rescanned the whole text per token: 32 s of a blocked event loop)."""
    completion = Completion(1, "long", 200_000, Stops(("never-a-twin-word",)), eos_at=10**9)
    made = 0
    while not completion.end:
        made += len(completion.take(5000)[0])
    assert made == 200_000 and completion.end.finish["type"] == "length"
    assert len(completion._strings._tail) < len("never-a-twin-word")  # type: ignore[union-attr]


def test_the_benchmark_client_always_asks_for_its_whole_budget() -> None:
    """Throughput numbers stay what they were: every study request sends ignore_eos."""
    from rayspec._config import load_config
    from rayspec.tune._trial import bench_plan
    from tests.helpers import TWIN_EXPERIMENT

    assert bench_plan(load_config(TWIN_EXPERIMENT)).ignore_eos is True


def test_a_tp_larger_than_the_nodes_gpus_fails_like_sglang(start_twin: StartTwin) -> None:
    twin = start_twin(["--tp-size", "16"], ready=False)
    code = twin.wait_exit(30)
    assert code not in (0, None)
    log = twin.log()
    assert "Scheduler hit an exception" in log and "CUDA error: invalid device ordinal" in log
    assert "Load weight begin" not in log
    assert classify_failure(log, code, "startup") is FailureReason.STARTUP_CRASH
