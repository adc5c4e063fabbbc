from __future__ import annotations

import pytest

from rayspec.server import parse_decode_line
from rayspec.server import parse_decode_lines
from rayspec.server import parse_exit_status
from rayspec.server import parse_startup_summary

V0523 = (
    "[2026-11-29 12:00:00 TP0] Decode batch, #running-req: 16, #token: 9120, token usage: 0.03, "
    "accept len: 3.12, accept rate: 0.70, cuda graph: True, gen throughput (token/s): 1234.56, "
    "#queue-req: 0"
)
V055 = (
    "[2026-11-29 12:00:00 TP0] Decode batch, #running-req: 1, #token: 530, token usage: 0.00, "
    "accept len: 1.73, accept rate: 0.58, cuda graph: True, gen throughput (token/s): 94.02, "
    "#queue-req: 0, "
)
V0410 = (
    "[2026-11-29 12:00:00 TP0] Decode batch. #running-req: 2, #token: 1000, token usage: 0.01, "
    "accept len: 2.50, cuda graph: False, gen throughput (token/s): 150.00, #queue-req: 3, "
)
NO_SPEC_TP1 = (
    "[2026-11-29 12:00:00] Decode batch, #running-req: 1, #token: 77, token usage: 0.00, "
    "cuda graph: True, gen throughput (token/s): 88.80, #queue-req: 0"
)


def test_0_5_23_line() -> None:
    b = parse_decode_line(V0523)
    assert b is not None
    assert (b.timestamp, b.ranks) == ("2026-11-29 12:00:00", "TP0")
    assert (b.running_req, b.num_tokens, b.queue_req) == (16, 9120, 0)
    assert (b.token_usage, b.accept_len, b.accept_rate) == (0.03, 3.12, 0.70)
    assert b.graph is True
    assert b.gen_throughput_tok_s == 1234.56


def test_0_5_5_trailing_comma() -> None:
    b = parse_decode_line(V055)
    assert b is not None and b.accept_len == 1.73 and b.queue_req == 0 and b.accept_rate == 0.58


def test_0_4_10_period_and_no_accept_rate() -> None:
    b = parse_decode_line(V0410)
    assert b is not None
    assert (b.accept_len, b.accept_rate, b.graph, b.queue_req) == (2.5, None, False, 3)


def test_without_speculation_at_tp1() -> None:
    b = parse_decode_line(NO_SPEC_TP1)
    assert b is not None
    assert (b.ranks, b.accept_len, b.accept_rate, b.gen_throughput_tok_s) == ("", None, None, 88.8)


@pytest.mark.parametrize(
    "line",
    [
        "[2026-11-29 12:00:00 DP0 TP0] Decode batch [iter], #running-req: 4, #full token: 12, "
        "full token usage: 0.10, cpu graph: False, gen throughput (token/s): 7.50, #queue-req: 1",
        "[2026-11-29 12:00:00.123 TP0] Decode batch, #running-req: 4, #token: 12, "
        "token usage: 0.10, accept len: 2.00, block accept len: 9.99, cap len: 4, "
        "npu graph: True, gen throughput (token/s): 7.50, #queue-req: 1",
    ],
)
def test_variants(line: str) -> None:
    b = parse_decode_line(line)
    assert b is not None
    assert (b.running_req, b.num_tokens, b.gen_throughput_tok_s, b.queue_req) == (4, 12, 7.5, 1)
    assert b.graph is not None
    assert b.accept_len in (None, 2.0)  # never the DSpark "block accept len"


def test_non_decode_lines() -> None:
    prefill = (
        "[2026-11-29 12:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 12, #cached-token: 0, "
        "#token: 12, token usage: 0.00, #running-req: 0, #queue-req: 0"
    )
    assert parse_decode_line(prefill) is None
    text = "\n".join([prefill, V0523, "noise", V055])
    assert [b.running_req for b in parse_decode_lines(text)] == [16, 1]


def test_startup_summary() -> None:
    text = (
        "[2026-11-29 12:00:00 TP0] Load weight end.\n"
        "[2026-11-29 12:00:01 TP0] max_total_num_tokens=1260000, chunked_prefill_size=8192, "
        "max_prefill_tokens=16384, max_running_requests=48, context_len=262144, "
        "available_gpu_mem=12.34 GB\n"
    )
    s = parse_startup_summary(text)
    assert s is not None
    assert s.max_total_num_tokens == 1260000
    assert (s.chunked_prefill_size, s.max_prefill_tokens) == (8192, 16384)
    assert (s.max_running_requests, s.context_len, s.available_gpu_mem_gb) == (48, 262144, 12.34)
    assert parse_startup_summary("nothing here") is None


def test_exit_status_line() -> None:
    text = (
        "[rayspec-reaper] server exited with returncode 1\n"
        "[rayspec-reaper] server exited with returncode -15\n"
    )
    assert parse_exit_status(text) == -15
    assert parse_exit_status("no line") is None
