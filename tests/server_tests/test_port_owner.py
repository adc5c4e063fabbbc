"""A readiness probe answered by another process on our port is not our server being ready."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from rayspec.server._process import ProcessInfo
from rayspec.server._process import owns_listener


def test_owns_listener_tells_our_tree_from_a_stranger() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        try:
            assert owns_listener(ProcessInfo(0, os.getpid(), "", time.time()), port) is True
            assert owns_listener(ProcessInfo(0, stranger.pid, "", time.time()), port) is False
        finally:
            stranger.kill()
            stranger.wait()
    # Nobody listens any more: it cannot be told.
    assert owns_listener(ProcessInfo(0, os.getpid(), "", time.time()), port) is None


def test_probe_lines_do_not_crowd_the_failure_tail() -> None:
    from rayspec.server._backends import _last_lines

    log = "\n".join(
        ["[2026-11-29 12:00:00 TP0] Load weight begin", "[2026-11-29 12:00:09 TP0] NCCL hang?"]
        + ['INFO:     127.0.0.1:5829 - "GET /health_generate HTTP/1.1" 503 Service Unavailable']
        * 500
    )
    assert _last_lines(log, 2).splitlines() == [
        "[2026-11-29 12:00:00 TP0] Load weight begin",
        "[2026-11-29 12:00:09 TP0] NCCL hang?",
    ]


def test_wait_port_free_waits_for_a_port_being_released() -> None:
    import threading

    import pytest

    from rayspec import LaunchError
    from rayspec.server._process import wait_port_free

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    threading.Timer(0.5, sock.close).start()
    wait_port_free("127.0.0.1", port, timeout_s=20)  # returns once it is released
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        with pytest.raises(LaunchError, match="already in use"):
            wait_port_free("127.0.0.1", held.getsockname()[1], timeout_s=0.5)
