from __future__ import annotations

import pytest
from failure_lines import LINES

from rayspec._exceptions import FailureReason
from rayspec.server import Phase
from rayspec.server import classify_failure


@pytest.mark.parametrize("name", sorted(LINES))
def test_real_failure_lines_before_ready(name: str) -> None:
    text, code, expected = LINES[name]
    assert classify_failure(text, code, "startup") == FailureReason(expected)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("draft_tree", FailureReason.INVALID_DRAFT_TREE),  # --skip-server-warmup: first request
        ("torch_oom", FailureReason.OUT_OF_MEMORY),
        ("plain_crash", FailureReason.CRASH_MID_BENCHMARK),
        ("argparse", FailureReason.CRASH_MID_BENCHMARK),  # argparse cannot fail after ready
    ],
)
def test_while_serving(name: str, expected: FailureReason) -> None:
    text, code, _ = LINES[name]
    assert classify_failure(text, code, Phase.SERVING) is expected


def test_phase_fallbacks() -> None:
    log = "[2026-11-29 12:00:00] Load weight begin\n"
    assert classify_failure(log, None, "timeout") is FailureReason.NEVER_READY
    assert classify_failure(log, -9, "startup") is FailureReason.STARTUP_CRASH
    assert classify_failure(log, 1, "serving") is FailureReason.CRASH_MID_BENCHMARK
    assert classify_failure("", None, "timeout") is FailureReason.NEVER_READY


def test_argparse_needs_exit_status_2() -> None:
    text, _, _ = LINES["argparse"]
    assert classify_failure(text, 1, "startup") is FailureReason.STARTUP_CRASH
    assert classify_failure(text, 2, "startup") is FailureReason.ARGUMENT_ERROR


def test_specific_cause_wins_over_timeout() -> None:
    text, _, _ = LINES["nccl_init"]
    assert classify_failure(text, None, "timeout") is FailureReason.NCCL_INIT


def test_first_collective_beats_init_rule() -> None:
    # Both texts carry ncclInvalidUsage; only the "no algorithm" one is the first collective.
    assert "ncclInvalidUsage" in LINES["nccl_first_collective"][0]
    text = LINES["nccl_first_collective"][0]
    assert classify_failure(text, 1, "startup") is FailureReason.NCCL_FIRST_COLLECTIVE


def test_graph_capture_beats_oom() -> None:
    text = LINES["graph_capture"][0]
    assert "CUDA out of memory" in text
    assert classify_failure(text, 1, "startup") is FailureReason.CUDA_GRAPH_CAPTURE


def test_bad_phase() -> None:
    with pytest.raises(ValueError):
        classify_failure("", 1, "later")


def test_twin_texts_if_present() -> None:
    nccl = pytest.importorskip("rayspec.twin._nccl")
    # The twin's own NCCL error texts must land in the same classes as the real ones.
    src = open(nccl.__file__).read()
    if "no algorithm/protocol available" in src:
        line = "NCCL WARN Error : no algorithm/protocol available for function AllReduce"
        assert classify_failure(line, 1, "startup") is FailureReason.NCCL_FIRST_COLLECTIVE
    init = (
        "NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details) [NCCL_PROTO=LL256]\n"
        "ncclInvalidUsage: This usually reflects invalid usage of NCCL library."
    )
    assert classify_failure(init, 1, "startup") is FailureReason.NCCL_INIT
