"""SGLang's HTTP API shapes, checked over HTTP against one running twin (as a client would)."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from rayspec.testing._twin import TwinProcess

from .conftest import SPEC_ARGS
from .conftest import TUNED_NCCL

META_KEYS = {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens"}
SPEC_KEYS = {
    "spec_verify_ct",
    "spec_accept_length",
    "spec_accept_rate",
    "spec_num_correct_drafts",
    "spec_num_proposed_drafts",
    "e2e_latency",
}


@pytest.fixture(scope="module")
def twin() -> Iterator[TwinProcess]:
    args = [
        *SPEC_ARGS,
        "--enable-metrics",
        "--decode-log-interval",
        "10",
        "--served-model-name",
        "kimi",
    ]
    env = {**TUNED_NCCL, "SGLANG_RECORD_STEP_TIME": "1"}
    with TwinProcess(args, env=env) as proc:
        proc.wait_ready()
        yield proc


def sse_events(resp: httpx.Response) -> list[dict]:  # type: ignore[type-arg]
    events = []
    done = False
    for line in resp.iter_lines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            continue
        events.append(json.loads(line[6:]))
    assert done, "stream did not end with [DONE]"
    return events


def test_status_endpoints(twin: TwinProcess) -> None:
    c = httpx.Client(base_url=twin.base_url)
    assert c.get("/health").status_code == 200
    assert c.get("/health_generate").status_code == 200
    assert c.get("/ready").status_code == 200
    models = c.get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "kimi"
    info = c.get("/get_model_info").json()
    assert info["model_path"] == "moonshotai/Kimi-K2.5" and info["is_generation"] is True
    assert c.get("/model_info").status_code == 200
    server = c.get("/server_info").json()
    assert server["version"] == "0.5.23"
    assert server["speculative_num_steps"] == 2
    assert server["speculative_num_draft_tokens"] == 3
    assert server["max_running_requests"] == 48
    assert server["attention_backend"] == "fa3"
    state = server["internal_states"][0]
    assert "last_gen_throughput" in state and "step_time_dict" in state
    assert state["speculative_eagle_topk"] == 1
    assert server["rayspec_twin"]["engine"] == "twin"
    assert "Ring/LL" in server["rayspec_twin"]["nccl"]
    assert server["rayspec_twin"]["nccl_ll128_risk"] is False
    assert c.get("/get_server_info").json()["tp_size"] == 8


def test_generate_not_streaming(twin: TwinProcess) -> None:
    body = {"text": "one two three four", "sampling_params": {"max_new_tokens": 24}}
    out = httpx.post(twin.base_url + "/generate", json=body, timeout=30).json()
    meta = out["meta_info"]
    assert META_KEYS | SPEC_KEYS <= set(meta)
    assert meta["prompt_tokens"] == 4
    assert meta["completion_tokens"] == 24 == len(out["output_ids"]) == len(out["text"].split())
    assert meta["finish_reason"]["type"] == "length"
    assert meta["spec_accept_length"] == pytest.approx(24 / meta["spec_verify_ct"])
    assert meta["spec_num_proposed_drafts"] == 2 * meta["spec_verify_ct"]
    assert meta["spec_accept_rate"] == pytest.approx(
        meta["spec_num_correct_drafts"] / meta["spec_num_proposed_drafts"]
    )
    again = httpx.post(twin.base_url + "/generate", json=body, timeout=30).json()
    assert again["text"] == out["text"]  # same prompt, same words (greedy-like)


def test_generate_batch(twin: TwinProcess) -> None:
    body = {"text": ["a b", "c d e"], "sampling_params": {"max_new_tokens": 5}}
    out = httpx.post(twin.base_url + "/generate", json=body, timeout=30).json()
    assert isinstance(out, list) and len(out) == 2
    assert [o["meta_info"]["prompt_tokens"] for o in out] == [2, 3]


def test_generate_streaming_is_cumulative(twin: TwinProcess) -> None:
    body = {"text": "hello there", "sampling_params": {"max_new_tokens": 40}, "stream": True}
    with httpx.stream("POST", twin.base_url + "/generate", json=body, timeout=30) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = sse_events(resp)
    counts = [e["meta_info"]["completion_tokens"] for e in events]
    assert counts == sorted(counts) and counts[-1] == 40
    assert all(len(e["output_ids"]) == e["meta_info"]["completion_tokens"] for e in events)
    for prev, cur in zip(events, events[1:], strict=False):
        assert cur["text"].startswith(prev["text"])
        assert cur["output_ids"][: len(prev["output_ids"])] == prev["output_ids"]
    assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert SPEC_KEYS <= set(events[-1]["meta_info"])
    assert "e2e_latency" not in events[0]["meta_info"]
    # speculation: fewer chunks than tokens (accepted drafts arrive together)
    assert len(events) < 40


def test_unknown_sampling_param_is_400(twin: TwinProcess) -> None:
    body = {"text": "x", "sampling_params": {"max_new_tokens": 2, "bogus": 1}, "rid_x": 1}
    resp = httpx.post(twin.base_url + "/generate", json=body)
    assert resp.status_code == 400 and "unknown field" in resp.text


@pytest.mark.parametrize("path", ["/generate", "/v1/completions", "/v1/chat/completions"])
def test_a_body_that_is_not_an_object_is_400(twin: TwinProcess, path: str) -> None:
    resp = httpx.post(twin.base_url + path, json=["not", "an", "object"])
    # SGLang's request model refuses it: OpenAI's error shape, "1 validation error".
    body = resp.json()
    assert resp.status_code == 400 and body["type"] == "Bad Request" and body["code"] == 400
    assert body["message"].startswith("1 validation error:")


def test_openai_client_completions_stream_with_usage(twin: TwinProcess) -> None:
    client = openai.OpenAI(base_url=twin.base_url + "/v1", api_key="none")
    stream = client.completions.create(
        model="kimi",
        prompt="Say something long",
        max_tokens=30,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage, finish = "", None, None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None and usage.completion_tokens == 30 and usage.prompt_tokens == 3
    assert usage.total_tokens == 33
    assert len(text.split()) == 30 and finish == "length"
    plain = client.completions.create(model="kimi", prompt="Say something long", max_tokens=30)
    assert plain.choices[0].text == text


def test_openai_client_chat_stream(twin: TwinProcess) -> None:
    client = openai.OpenAI(base_url=twin.base_url + "/v1", api_key="none")
    stream = client.chat.completions.create(
        model="kimi",
        messages=[{"role": "user", "content": "hi there"}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    content, usage = "", None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            content += chunk.choices[0].delta.content
        if chunk.usage is not None:
            usage = chunk.usage
    assert usage is not None and usage.completion_tokens == 12
    assert len(content.split()) == 12
    whole = client.chat.completions.create(
        model="kimi", messages=[{"role": "user", "content": "hi there"}], max_tokens=12
    )
    assert whole.choices[0].message.content == content


def test_window_stats_flush_and_busy(twin: TwinProcess) -> None:
    c = httpx.Client(base_url=twin.base_url, timeout=30)
    assert c.post("/flush_cache").status_code == 200
    state = c.get("/server_info").json()["internal_states"][0]
    assert "avg_spec_accept_length" not in state  # no window since the flush
    result: dict[str, object] = {}

    def run() -> None:
        result["out"] = c.post(
            "/generate", json={"text": "long", "sampling_params": {"max_new_tokens": 60}}
        ).json()

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.monotonic() + 10
    busy = None
    while time.monotonic() < deadline and worker.is_alive():
        busy = c.get("/flush_cache")
        if busy.status_code == 400:
            break
        time.sleep(0.01)
    worker.join()
    assert busy is not None and busy.status_code == 400
    assert busy.text.startswith("Cache not flushed")
    state = c.get("/server_info").json()["internal_states"][0]
    # 60 tokens took more than 10 decode iterations: a window completed
    assert 1.0 <= state["avg_spec_accept_length"] <= 3.0
    assert state["last_gen_throughput"] > 0
    assert state["step_time_dict"]["1"]
    flushed = c.get("/flush_cache")
    assert flushed.status_code == 200 and flushed.text.startswith("Cache flushed")
    assert "avg_spec_accept_length" not in c.get("/server_info").json()["internal_states"][0]


def test_decode_log_line_shape(twin: TwinProcess) -> None:
    httpx.post(
        twin.base_url + "/generate",
        timeout=30,
        json={"text": "x", "sampling_params": {"max_new_tokens": 40}},
    )
    lines = [ln for ln in twin.log().splitlines() if "Decode batch" in ln]
    assert lines
    line = lines[-1]
    assert re.match(
        r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d TP0\] Decode batch, #running-req: \d+, "
        r"#token: \d+, token usage: \d\.\d\d, accept len: \d\.\d\d, "
        r"accept rate: \d\.\d\d, cuda graph: True, gen throughput \(token/s\): "
        r"[0-9.]+, #queue-req: \d+$",
        line,
    ), line


def test_metrics(twin: TwinProcess) -> None:
    text = httpx.get(twin.base_url + "/metrics").text
    for name in (
        "sglang:spec_accept_length",
        "sglang:spec_accept_rate",
        "sglang:gen_throughput",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
        "sglang:token_usage",
        "sglang:prompt_tokens_total",
        "sglang:generation_tokens_total",
        "sglang:num_requests_total",
        "sglang:spec_verify_calls_total",
        "sglang:time_to_first_token_seconds_bucket",
        "sglang:e2e_request_latency_seconds_count",
    ):
        assert name in text
    assert 'model_name="kimi"' in text and 'tp_rank="0"' in text


def test_metrics_absent_without_flag(start_twin) -> None:  # type: ignore[no-untyped-def]
    plain = start_twin(["--tp-size", "8", "--twin-version", "0.5.19"])
    assert httpx.get(plain.base_url + "/metrics").status_code == 404
    assert httpx.get(plain.base_url + "/ready").status_code == 404  # /ready is >= 0.5.20
    body = {"text": "x", "sampling_params": {"max_new_tokens": 2, "bogus": 1}}
    assert httpx.post(plain.base_url + "/generate", json=body).status_code == 200  # < 0.5.22


def test_client_disconnect_is_quiet_and_frees_the_slot(twin: TwinProcess) -> None:
    body = {"text": "leave early", "sampling_params": {"max_new_tokens": 400}, "stream": True}
    with httpx.stream("POST", twin.base_url + "/generate", json=body, timeout=30) as resp:
        for i, _ in enumerate(resp.iter_lines()):
            if i >= 4:
                break  # close the connection mid-stream
    c = httpx.Client(base_url=twin.base_url, timeout=30)
    out = c.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 3}})
    assert out.json()["meta_info"]["completion_tokens"] == 3
    deadline = time.monotonic() + 10
    while c.post("/flush_cache").status_code != 200:  # the dropped request left the batch
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert "Traceback" not in twin.log().split("ready to roll!")[1]
