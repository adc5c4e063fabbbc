"""The process layer alone (no Ray): the reaper tears down every process it is given."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import fake_pids
from conftest import pids_alive
from conftest import wait_gone
from conftest import wait_reaper

from rayspec._exceptions import LaunchError
from rayspec.server._logparse import parse_exit_status
from rayspec.server._process import ProcessInfo
from rayspec.server._process import is_alive
from rayspec.server._process import process_tree
from rayspec.server._process import reaper_alive
from rayspec.server._process import start_process
from rayspec.server._process import stop_process


def wait_healthy(url: str, timeout_s: float = 15.0) -> None:
    end = time.monotonic() + timeout_s
    with httpx.Client(trust_env=False) as client:
        while time.monotonic() < end:
            try:
                if client.get(url + "/health_generate", timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
    raise AssertionError("fake server never became healthy")


def test_stop_kills_whole_tree_including_setsid_and_orphans(make_launch) -> None:
    launch = make_launch("--spawn-tree", "--ready-after-s", "0")
    info = start_process(launch, grace_s=2.0)
    try:
        wait_healthy(launch.base_url)
        pids = fake_pids(info.log_path)
        assert set(pids) == {
            "server",
            "child",
            "sh",
            "grandchild",
            "setsid_grandchild",
            "setsid_orphan",
        }
        assert pids["server"] == info.server_pid
        assert sorted(pids_alive(pids.values())) == sorted(pids.values())
        # The orphan left its parent and its session, and still belongs to the reaper.
        assert pids["setsid_orphan"] in process_tree(info.reaper_pid)
        assert is_alive(info)
    finally:
        assert stop_process(info, timeout_s=10.0)
    assert wait_gone([*pids.values(), info.reaper_pid]) == []
    assert not is_alive(info) and not reaper_alive(info)
    assert parse_exit_status(Path(info.log_path).read_text()) == -15


def test_sigkill_after_grace_when_sigterm_is_ignored(make_launch) -> None:
    launch = make_launch("--ignore-sigterm", "--ready-after-s", "0")
    info = start_process(launch, grace_s=0.3)
    wait_healthy(launch.base_url)
    assert stop_process(info, timeout_s=10.0)
    text = Path(info.log_path).read_text()
    assert parse_exit_status(text) == -9
    assert "SIGKILL after 0.3 s grace" in text
    assert wait_gone([info.server_pid]) == []


def test_server_exiting_by_itself_takes_its_tree_and_logs_status(make_launch) -> None:
    launch = make_launch("--spawn-tree", "--fail", "torch_oom")
    info = start_process(launch, grace_s=2.0)
    assert wait_reaper(info, timeout_s=20.0), "reaper should exit once the server has"
    pids = fake_pids(info.log_path)
    assert len(pids) == 6
    assert wait_gone(list(pids.values())) == []
    text = Path(info.log_path).read_text()
    assert "CUDA out of memory" in text
    assert parse_exit_status(text) == 1
    assert stop_process(info, timeout_s=1.0)  # stopping a finished tree is a no-op


def test_owner_death_tears_the_tree_down(make_launch) -> None:
    owner = subprocess.Popen(["sleep", "600"])
    try:
        launch = make_launch("--spawn-tree", "--ready-after-s", "0")
        info = start_process(launch, owner_pid=owner.pid, grace_s=2.0)
        wait_healthy(launch.base_url)
        pids = fake_pids(info.log_path)
    finally:
        owner.kill()
        owner.wait()
    assert wait_reaper(info, timeout_s=15.0)
    assert wait_gone([*pids.values(), info.reaper_pid]) == []
    assert f"owner process {owner.pid} died" in Path(info.log_path).read_text()


def test_environment_is_exactly_the_candidates(make_launch, monkeypatch) -> None:
    monkeypatch.setenv("NCCL_ALGO", "Tree")  # left on the node: must not leak
    monkeypatch.setenv("RAYSPEC_KEEP", "kept")
    launch = make_launch(
        "--print-env",
        "NCCL_PROTO,NCCL_ALGO,RAYSPEC_KEEP,EMPTY",
        env={"NCCL_PROTO": "LL", "EMPTY": ""},
        unset_env=("NCCL_ALGO",),
        name="env.log",
    )
    info = start_process(launch, grace_s=1.0)
    try:
        wait_healthy(launch.base_url)
    finally:
        stop_process(info)
    line = re.search(r"FAKE_ENV (.*)", Path(info.log_path).read_text())
    assert line is not None
    assert json.loads(line.group(1)) == {
        "NCCL_PROTO": "LL",
        "NCCL_ALGO": None,
        "RAYSPEC_KEEP": "kept",
        "EMPTY": "",
    }


@pytest.mark.parametrize("name", ["1BAD", "NCCL-PROTO", "A B", "", "X=Y"])
def test_invalid_env_names_refused(make_launch, name: str) -> None:
    launch = make_launch(env={name: "1"})
    with pytest.raises(LaunchError, match="invalid environment variable name"):
        start_process(launch)
    with pytest.raises(LaunchError, match="invalid environment variable name"):
        start_process(dataclasses.replace(launch, env=(), unset_env=(name,)))


def test_port_taken(make_launch, monkeypatch) -> None:
    monkeypatch.setattr("rayspec.server._process.PORT_WAIT_S", 0.5)  # how long it waits first
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        launch = make_launch(port=port)
        with pytest.raises(LaunchError, match=f"port {port} on 127.0.0.1 is already in use"):
            start_process(launch)


def test_missing_executable(make_launch) -> None:
    launch = make_launch()
    launch = dataclasses.replace(launch, argv=("/nonexistent/sglang", "serve"))
    with pytest.raises(LaunchError, match="could not start '/nonexistent/sglang'"):
        start_process(launch)
    assert "cannot start" in Path(launch.log_path).read_text()


def test_no_shell_anywhere(make_launch, tmp_path) -> None:
    marker = tmp_path / "pwned"
    launch = make_launch()
    launch = dataclasses.replace(
        launch, argv=(sys.executable, "-c", "import sys; print(sys.argv[1:])", f"; touch {marker}")
    )
    info = start_process(launch, grace_s=1.0)
    assert wait_reaper(info, timeout_s=10.0)
    assert not marker.exists()
    assert f"['; touch {marker}']" in Path(info.log_path).read_text()


def test_stop_never_signals_a_stranger_with_a_reused_pid(tmp_path) -> None:
    stranger = subprocess.Popen(["sleep", "600"])
    try:
        info = ProcessInfo(stranger.pid, stranger.pid, str(tmp_path / "x.log"), 0.0)
        assert stop_process(info, timeout_s=0.5)  # "already gone", as far as we know
        assert wait_reaper(info, timeout_s=0.1)
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


def test_unwritable_log_is_a_launch_error(make_launch, tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    launch = dataclasses.replace(make_launch(), log_path=str(blocker / "sub" / "server.log"))
    with pytest.raises(LaunchError, match="cannot write the server log"):
        start_process(launch)


def test_the_server_runs_at_the_niceness_it_is_given(make_launch) -> None:
    """A reaper started from a Ray worker (niceness 15) runs the server at the node's niceness:
    raising it always works; lowering it works with the privilege, else the log says why."""
    now = os.getpriority(os.PRIO_PROCESS, 0)
    for wanted in (min(now + 3, 19), now - 1 if now > -20 else now):
        launch = make_launch("--ready-after-s", "0")
        info = start_process(launch, grace_s=2.0, niceness=wanted)
        try:
            wait_healthy(launch.base_url)
            got = os.getpriority(os.PRIO_PROCESS, info.server_pid)
            reaper = os.getpriority(os.PRIO_PROCESS, info.reaper_pid)
        finally:
            assert stop_process(info, timeout_s=10.0)
        text = Path(info.log_path).read_text()
        if wanted >= now or os.geteuid() == 0:
            assert (got, reaper) == (wanted, wanted)
            assert "not the node's" not in text
        else:  # no CAP_SYS_NICE: the server runs on at the caller's, and the log says so
            assert got == now
            assert f"the server runs at niceness {now}, not the node's {wanted}" in text


def test_no_niceness_keeps_the_callers(make_launch) -> None:
    launch = make_launch("--ready-after-s", "0")
    info = start_process(launch, grace_s=2.0)
    try:
        wait_healthy(launch.base_url)
        assert os.getpriority(os.PRIO_PROCESS, info.server_pid) == os.getpriority(
            os.PRIO_PROCESS, 0
        )
    finally:
        assert stop_process(info, timeout_s=10.0)
