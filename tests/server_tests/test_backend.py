"""SGLangBackend / TwinBackend lifecycle against the fake server (no Ray)."""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import fake_pids
from conftest import wait_gone
from failure_lines import LINES

from rayspec._exceptions import FailureReason
from rayspec._exceptions import LaunchError
from rayspec._exceptions import ServerExited
from rayspec._exceptions import ServerStartTimeout
from rayspec.server import ServerState
from rayspec.server import SGLangBackend
from rayspec.server import TwinBackend
from rayspec.server import backend_for


def test_ready_flush_stop(make_launch) -> None:
    launch = make_launch("--spawn-tree", "--ready-after-s", "0.6", "--flush-busy", "2")
    backend = SGLangBackend(grace_s=2.0)
    assert backend.state is ServerState.NEW and backend.log_path is None
    backend.start(launch)
    assert backend.state is ServerState.RUNNING
    info = backend.wait_ready(poll_s=0.1)
    assert info["fake"] is True and info["port"] == launch.port
    assert backend.alive()
    backend.raise_if_dead()
    backend.flush_cache(timeout_s=10.0)  # two 400 "busy" answers, then 200
    assert "FAKE_FLUSH" in backend.log_tail(5)
    pids = fake_pids(launch.log_path)
    tree = backend.process_tree()
    assert set(pids.values()) <= set(tree)
    assert backend.stop() == -15
    assert backend.state is ServerState.STOPPED and not backend.alive()
    assert wait_gone(tree) == []
    assert backend.stop() == -15  # idempotent


def test_double_start_refused(make_launch) -> None:
    with SGLangBackend(grace_s=1.0) as backend:
        backend.start(make_launch("--ready-after-s", "0"))
        with pytest.raises(LaunchError, match="starts once"):
            backend.start(make_launch(name="second.log"))
    assert backend.state is ServerState.STOPPED
    with pytest.raises(LaunchError, match="starts once"):
        backend.start(make_launch(name="third.log"))


@pytest.mark.parametrize(
    "name", ["torch_oom", "argparse", "nccl_first_collective", "draft_tree", "plain_crash"]
)
def test_exit_before_ready_is_classified(make_launch, name: str) -> None:
    text, code, expected = LINES[name]
    backend = SGLangBackend(grace_s=1.0)
    backend.start(make_launch("--fail", name, "--spawn-tree"))
    try:
        with pytest.raises(ServerExited) as err:
            backend.wait_ready(poll_s=0.1)
    finally:
        backend.stop()
    exc = err.value
    assert exc.reason is FailureReason(expected)
    assert exc.returncode == code
    assert text.splitlines()[-1] in exc.log_tail
    assert len(exc.log_tail.splitlines()) <= 40
    assert f"returncode {code}" in str(exc)
    assert wait_gone(list(fake_pids(backend.log_path).values())) == []


def test_never_ready_times_out(make_launch) -> None:
    with SGLangBackend(grace_s=1.0) as backend:
        backend.start(make_launch("--never-ready", timeout_s=1.0))
        with pytest.raises(ServerStartTimeout) as err:  # the startup timeout, not a hang
            backend.wait_ready(poll_s=0.1)
        assert err.value.reason is FailureReason.NEVER_READY
        assert err.value.returncode is None
        assert "FAKE_PID server=" in err.value.log_tail
        assert backend.alive()  # a timeout does not stop the server; stop() does


# What real SGLang 0.5.23 prints when its HTTP port was taken while it started; then it hangs,
# alive, in "Waiting for application shutdown." (seen on a CPU; tests/real_sglang).
BIND_ERROR = (
    "[2026-12-01 19:20:19] ERROR:    [Errno 98] error while attempting to bind on address "
    "('127.0.0.1', 31955): address already in use"
)


def test_a_taken_port_fails_readiness_at_once(make_launch) -> None:
    with SGLangBackend(grace_s=1.0) as backend:
        backend.start(make_launch("--never-ready", "--spawn-tree", "--say", BIND_ERROR,
                                  timeout_s=120.0))  # fmt: skip
        with pytest.raises(LaunchError) as err:
            backend.wait_ready(poll_s=0.1)
        assert not isinstance(err.value, ServerStartTimeout)  # not after the startup timeout
        assert err.value.reason is FailureReason.UNKNOWN  # not the candidate's fault
        assert "address already in use" in str(err.value)
        assert BIND_ERROR in err.value.log_tail
        pids = list(fake_pids(backend.log_path).values())
    assert wait_gone(pids) == []


def test_the_launch_line_is_not_read_as_the_servers_words(make_launch) -> None:
    # rayspec's own "[rayspec] launch:" line quotes the argv: a value carrying a bind error's
    # text (here an ignored argument) is not the server's. Found under load: the bind scan read
    # the quoted --say argument before the fake server had printed it.
    with SGLangBackend(grace_s=1.0) as backend:
        backend.start(make_launch("--never-ready", "--note", BIND_ERROR, timeout_s=3.0))
        with pytest.raises(ServerStartTimeout) as err:
            backend.wait_ready(poll_s=0.1)
        assert "cannot listen" not in str(err.value)
        assert "[rayspec] launch:" in err.value.log_tail  # the launch line is still shown


def test_crash_while_serving(make_launch, tmp_path) -> None:
    trigger = tmp_path / "crash-now"
    with SGLangBackend(grace_s=1.0) as backend:
        backend.start(make_launch("--ready-after-s", "0", "--fail-on-file", str(trigger)))
        backend.wait_ready(poll_s=0.1)
        trigger.touch()  # the crash comes once the server is ready and known to be
        deadline = time.monotonic() + 10
        while backend.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(ServerExited) as err:
            backend.raise_if_dead()
        assert err.value.reason is FailureReason.CRASH_MID_BENCHMARK
        assert err.value.returncode == 1
        with pytest.raises(ServerExited):
            backend.flush_cache(timeout_s=1.0)


def test_oom_while_serving_keeps_its_cause(make_launch, tmp_path) -> None:
    trigger = tmp_path / "oom-now"
    with SGLangBackend(grace_s=1.0) as backend:
        backend.start(
            make_launch("--ready-after-s", "0", "--fail", "torch_oom", "--fail-on-file",
                        str(trigger))
        )  # fmt: skip
        backend.wait_ready(poll_s=0.1)
        trigger.touch()
        deadline = time.monotonic() + 10
        while backend.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(ServerExited) as err:
            backend.raise_if_dead()
        assert err.value.reason is FailureReason.OUT_OF_MEMORY


def test_stop_interrupts_wait_ready(make_launch) -> None:
    backend = SGLangBackend(grace_s=1.0)
    backend.start(make_launch("--never-ready", timeout_s=60.0))
    timer = threading.Timer(0.5, backend.stop)
    timer.start()
    try:
        with pytest.raises(LaunchError) as err:
            backend.wait_ready(poll_s=0.1)
    finally:
        timer.join()
        backend.stop()
    assert err.value.reason is FailureReason.INTERRUPTED


def test_engine_must_match(make_launch) -> None:
    twin_argv = (sys.executable, "-m", "rayspec.twin.server", "--port", "1")
    sglang_launch = make_launch()
    with pytest.raises(LaunchError, match="must not run the twin"):
        SGLangBackend().start(dataclasses.replace(sglang_launch, argv=twin_argv))
    with pytest.raises(LaunchError, match="must run rayspec.twin.server"):
        TwinBackend().start(dataclasses.replace(sglang_launch, engine="twin"))
    with pytest.raises(LaunchError, match="runs engine 'sglang'"):
        SGLangBackend().start(dataclasses.replace(sglang_launch, engine="twin"))
    with pytest.raises(LaunchError, match="unknown server engine 'vllm'"):
        backend_for("vllm")
    assert isinstance(backend_for("twin"), TwinBackend)
    assert isinstance(backend_for("sglang"), SGLangBackend)
    assert not Path(sglang_launch.log_path).exists()  # nothing was started


def test_calls_before_start(make_launch) -> None:
    backend = SGLangBackend()
    with pytest.raises(LaunchError, match="not started"):
        backend.wait_ready()
    assert backend.log_tail() == "" and not backend.alive()
    assert backend.stop() is None
