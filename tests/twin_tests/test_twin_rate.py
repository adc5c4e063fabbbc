"""The twin streams at its model's rate, batches concurrent requests and is reproducible.

Tolerances are deliberately generous (a busy 2-core machine runs these); the exact figures are
in ``benchmarks/twin_fidelity.py``.
"""

from __future__ import annotations

import json
import os
import threading
import time

import httpx

from rayspec._types import SpecSettings
from rayspec.twin import PerfModel
from rayspec.twin import load_profile
from rayspec.twin import resolve_nccl

from .conftest import SPEC_ARGS
from .conftest import TUNED_NCCL
from .conftest import StartTwin

SPEC = SpecSettings("EAGLE3", 2, 1, 3)


def model_tok_s(env: dict[str, str], spec: SpecSettings | None, batch: int = 1) -> float:
    profile = load_profile("kimi-k2.5-tp8-pcie")
    return PerfModel(profile, resolve_nccl(env, profile), spec).expected_tok_s(batch)


def stream_rate(base_url: str, max_tokens: int) -> tuple[float, int]:
    """Decode tok/s between the first and the last chunk, and the chunk count."""
    body = {
        "text": "measure me",
        "sampling_params": {"max_new_tokens": max_tokens},
        "stream": True,
    }
    first = last = None
    tokens_at_first = tokens = chunks = 0
    with httpx.stream("POST", base_url + "/generate", json=body, timeout=60) as resp:
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            now = time.perf_counter()
            tokens = json.loads(line[6:])["meta_info"]["completion_tokens"]
            chunks += 1
            if first is None:
                first, tokens_at_first = now, tokens
            last = now
    assert first is not None and last is not None and tokens == max_tokens
    return (tokens - tokens_at_first) / (last - first), chunks


def test_streamed_rate_follows_the_model(start_twin: StartTwin) -> None:
    spec_twin = start_twin(list(SPEC_ARGS), env=TUNED_NCCL)
    base_twin = start_twin(["--tp-size", "8"])  # untuned NCCL, no speculation
    spec_rate, chunks = stream_rate(spec_twin.base_url, 150)
    base_rate, _ = stream_rate(base_twin.base_url, 100)
    spec_expected = model_tok_s(TUNED_NCCL, SPEC)  # ~94.9
    base_expected = model_tok_s({}, None)  # ~63.1
    assert abs(spec_rate / spec_expected - 1) < 0.25, (spec_rate, spec_expected)
    assert abs(base_rate / base_expected - 1) < 0.25, (base_rate, base_expected)
    assert chunks < 150  # several tokens per chunk


def test_concurrent_requests_are_batched_and_capped(start_twin: StartTwin) -> None:
    twin = start_twin(
        ["--tp-size", "8", "--max-running-requests", "3", "--decode-log-interval", "5"],
        env=TUNED_NCCL,
    )
    results: list[dict] = []  # type: ignore[type-arg]
    client = httpx.Client(base_url=twin.base_url, timeout=60)

    def one() -> None:
        body = {"text": "go", "sampling_params": {"max_new_tokens": 80}}
        results.append(client.post("/generate", json=body).json())

    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r["meta_info"]["completion_tokens"] for r in results] == [80] * 4
    decode = [ln for ln in twin.log().splitlines() if "Decode batch" in ln]
    running = [int(ln.split("#running-req: ")[1].split(",")[0]) for ln in decode]
    queued = [int(ln.split("#queue-req: ")[1]) for ln in decode]
    assert max(running) == 3  # batched, and never above the cap
    assert max(queued) == 1  # the fourth request waited in the queue


def test_fixed_seed_is_reproducible_and_noop_variables_change_nothing(
    start_twin: StartTwin,
) -> None:
    args = [*SPEC_ARGS, "--twin-seed", "7", "--twin-realtime", "false"]
    record = {"SGLANG_RECORD_STEP_TIME": "1"}
    effective = {"NCCL_PROTO": "LL", "NCCL_P2P_LEVEL": "SYS"}
    noop = {
        **effective,
        "NCCL_ALGO": "Ring",
        "NCCL_BUFFSIZE": "16777216",
        "NCCL_NTHREADS": "512",
        "NCCL_MAX_NCHANNELS": "16",
        "NCCL_CUMEM_ENABLE": "1",
    }
    twins = [
        start_twin(args, env={**record, **TUNED_NCCL}, ready=False),
        start_twin(args, env={**record, **noop}, ready=False),
        start_twin(args, env={**record, **effective, "NCCL_P2P_LEVEL": "sys"}, ready=False),
    ]
    outs = []
    for twin in twins:
        twin.wait_ready()
        body = {"text": "same prompt", "sampling_params": {"max_new_tokens": 200}}
        out = httpx.post(twin.base_url + "/generate", json=body, timeout=60).json()
        info = httpx.get(twin.base_url + "/server_info").json()["internal_states"][0]
        outs.append((out, info["step_time_dict"]))
    (a, steps_a), (b, steps_b), (c, steps_c) = outs
    for key in ("spec_verify_ct", "spec_num_correct_drafts", "completion_tokens"):
        assert a["meta_info"][key] == b["meta_info"][key] == c["meta_info"][key]
    assert a["text"] == b["text"]
    assert steps_a == steps_b  # same seed, no-op variables: identical step times
    # lower-case "sys" is ignored by NCCL: default P2P level, slower steps
    assert min(steps_c["1"]) > max(steps_a["1"])
    assert os.environ.get("NCCL_PROTO") is None  # the test process is untouched
