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
