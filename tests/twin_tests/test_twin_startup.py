"""Starting the twin as a launcher would: flag errors, NCCL failures, tree budget, faults."""

from __future__ import annotations

import time

import httpx
import pytest

from rayspec.testing._twin import TwinProcess

from .conftest import SPEC_ARGS
from .conftest import TUNED_NCCL
from .conftest import StartTwin

READY = "The server is fired up and ready to roll!"
SCHED_EXC = "Scheduler hit an exception"
SIGQUIT = "Received sigquit from a child process. It usually means the child failed."


def tree_args(*extra: str) -> list[str]:
    return [
        "--tp-size",
        "8",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        "d",
        "--speculative-num-steps",
        "2",
        "--speculative-eagle-topk",
        "2",
        "--speculative-num-draft-tokens",
        "16",
        *extra,
    ]


def test_unknown_flag_exits_2(start_twin: StartTwin) -> None:
    twin = start_twin(["--no-such-flag", "1"], ready=False)
    assert twin.wait_exit(30) == 2
    assert "unrecognized arguments" in twin.log()


def test_ambiguous_cuda_graph_flag_exits_2(start_twin: StartTwin) -> None:
    twin = start_twin(["--cuda-graph-max-bs", "8"], ready=False)
    assert twin.wait_exit(30) == 2
    assert "ambiguous option: --cuda-graph-max-bs" in twin.log()


def test_partial_spec_flags_fail_before_startup(start_twin: StartTwin) -> None:
    twin = start_twin(
        [
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-draft-model-path",
            "d",
            "--speculative-num-steps",
            "3",
        ],
        ready=False,
    )
    assert twin.wait_exit(30) not in (0, None)
    log = twin.log()
    assert "TypeError: '>' not supported between instances of 'NoneType' and 'int'" in log
    assert "Init torch distributed" not in log and READY not in log


def test_topk_one_forcing_and_cap_visible(start_twin: StartTwin) -> None:
    twin = start_twin(
        [
            "--tp-size",
            "8",
            "--speculative-algorithm",
            "EAGLE3",
            "--speculative-draft-model-path",
            "d",
            "--speculative-num-steps",
            "3",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "8",
        ]
    )
    info = httpx.get(twin.base_url + "/get_server_info").json()
    assert info["speculative_num_draft_tokens"] == 4
    assert info["max_running_requests"] == 48
    assert info["internal_states"][0]["speculative_num_draft_tokens"] == 4
    log = twin.log()
    assert "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1" in log
    assert "Max running requests is reset to 48 for speculative decoding." in log
    # startup order of SGLang (docs/sglang.md, *Log lines*)
    order = [
        "Init torch distributed begin",
        "Load weight begin",
        "KV Cache is allocated",
        "Capture decode CUDA graph begin",
        "max_total_num_tokens=",
        "Uvicorn running",
        READY,
    ]
    positions = [log.index(s) for s in order]
    assert positions == sorted(positions)
    assert "[" in log and " TP0] Init torch distributed begin." in log


def test_tree_budget_fails_at_warmup(start_twin: StartTwin) -> None:
    twin = start_twin(tree_args(), ready=False)
    code = twin.wait_exit(30)
    assert code not in (0, None)
    log = twin.log()
    assert SCHED_EXC in log
    assert "RuntimeError: selected index k out of range" in log
    assert "Initialization failed. warmup error:" in log
    assert READY not in log


def test_tree_budget_with_skip_warmup_fails_at_first_request(start_twin: StartTwin) -> None:
    twin = start_twin(tree_args("--skip-server-warmup"))
    assert READY in twin.log()
    with pytest.raises(httpx.TransportError):
        with httpx.stream(
            "POST",
            twin.base_url + "/generate",
            timeout=10.0,
            json={
                "text": "hi",
                "sampling_params": {"max_new_tokens": 8},
                "stream": True,
            },
        ) as resp:
            for _ in resp.iter_lines():
                pass
    assert twin.wait_exit(30) not in (0, None)
    log = twin.log()
    assert "RuntimeError: selected index k out of range" in log and SIGQUIT in log


def test_nccl_bad_protocol_fails_at_init(start_twin: StartTwin) -> None:
    twin = start_twin(list(SPEC_ARGS), env={"NCCL_PROTO": "LL256"}, ready=False)
    assert twin.wait_exit(30) not in (0, None)
    log = twin.log()
    assert SCHED_EXC in log and SIGQUIT in log
    assert "invalid usage" in log and "LL256" in log
    assert "Init torch distributed begin" in log
    assert "Init torch distributed ends" not in log and "Load weight begin" not in log
    assert READY not in log


def test_nccl_no_algorithm_fails_at_first_collective(start_twin: StartTwin) -> None:
    twin = start_twin(list(SPEC_ARGS), env={"NCCL_ALGO": "NVLS"}, ready=False)
    assert twin.wait_exit(30) not in (0, None)
    log = twin.log()
    assert "no algorithm/protocol available for function AllReduce" in log
    assert "Load weight end" in log  # got past communicator init
    assert SCHED_EXC in log and SIGQUIT in log and READY not in log


@pytest.mark.parametrize(
    ("fault", "texts"),
    [
        ("crash-startup", [SCHED_EXC, SIGQUIT]),
        ("oom", ["torch.OutOfMemoryError: CUDA out of memory", SCHED_EXC]),
        (
            "oom:kv",
            [
                "RuntimeError: Not enough memory. Please try to increase "
                "--mem-fraction-static. Current value: mem_fraction_static=",
                SCHED_EXC,
            ],
        ),
        (
            "graph-capture",
            [
                "Capture cuda graph failed:",
                "Possible solutions:",
                "--cuda-graph-max-bs-decode to a smaller value",
            ],
        ),
    ],
)
def test_startup_faults(start_twin: StartTwin, fault: str, texts: list[str]) -> None:
    twin = start_twin(["--twin-fault", fault], ready=False)
    assert twin.wait_exit(30) not in (0, None)
    log = twin.log()
    for text in texts:
        assert text in log
    assert READY not in log


def wait_for_log(twin: TwinProcess, text: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in twin.log():
        assert time.monotonic() < deadline, twin.log()
        assert twin.poll() is None, twin.log()
        time.sleep(0.05)


def test_never_ready_serves_503(start_twin: StartTwin) -> None:
    twin = start_twin(["--twin-fault", "never-ready"], ready=False)
    wait_for_log(twin, "Uvicorn running")
    time.sleep(0.5)  # well past --twin-startup-s 0.2
    assert httpx.get(twin.base_url + "/health").status_code == 503
    assert httpx.get(twin.base_url + "/health_generate").status_code == 503
    assert httpx.get(twin.base_url + "/ready").status_code == 503
    assert twin.poll() is None
    assert READY not in twin.log()


def test_crash_after_cuts_streams(start_twin: StartTwin) -> None:
    twin = start_twin(["--twin-fault", "crash-after:10"])
    received = 0
    with pytest.raises(httpx.TransportError):
        with httpx.stream(
            "POST",
            twin.base_url + "/generate",
            timeout=10.0,
            json={
                "text": "hi",
                "sampling_params": {"max_new_tokens": 50},
                "stream": True,
            },
        ) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    received += 1
    assert 1 <= received <= 10
    assert twin.wait_exit(30) not in (0, None)
    assert SIGQUIT in twin.log()


def test_stall_keeps_connection_open(start_twin: StartTwin) -> None:
    twin = start_twin(["--twin-fault", "stall:5"])
    tokens = 0
    with pytest.raises(httpx.ReadTimeout):
        with httpx.stream(
            "POST",
            twin.base_url + "/generate",
            timeout=httpx.Timeout(10.0, read=1.5),
            json={"text": "hi", "sampling_params": {"max_new_tokens": 40}, "stream": True},
        ) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: {"):
                    tokens = int(line.split('"completion_tokens":')[1].split(",")[0])
    assert tokens == 5
    assert twin.poll() is None  # alive, just hung


def test_stop_is_clean() -> None:
    with TwinProcess(["--tp-size", "8"], env=TUNED_NCCL) as twin:
        twin.wait_ready()
    assert twin.proc is not None and twin.proc.returncode == 0
