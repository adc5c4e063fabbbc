"""The reaper stops a server as SGLang wants to be stopped: SIGTERM to the server alone, which
stops its own children. Real SGLang 0.5.23 whose scheduler got the SIGTERM too logged
"Subprocess scheduler_0 ... crashed with exit code -15", spent 5 s on crash diagnostics and
SIGKILLed itself (returncode -9) on every ordinary stop (tests/real_sglang)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from conftest import pids_alive

from rayspec._types import LaunchSpec
from rayspec.server._logparse import parse_exit_status
from rayspec.server._process import process_tree
from rayspec.server._process import start_process
from rayspec.server._process import stop_process
from tests.helpers import free_port

# A server like SGLang's: a child that says so if a SIGTERM reaches it, and a SIGTERM handler
# in the server that drains, then ends the child itself (SIGKILL) and exits 0.
SERVER = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", '''
import signal, sys, time
def term(*_):
    print("child got", "SIGTERM", flush=True)
    sys.exit(1)
signal.signal(signal.SIGTERM, term)
print("child", "up", flush=True)
time.sleep(600)
'''])
def term(*_):
    print("server got", "SIGTERM", flush=True)
    time.sleep(0.5)  # SGLang drains its requests first
    child.kill()
    child.wait()
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
time.sleep(600)
"""


def test_sigterm_goes_to_the_server_which_stops_its_children(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    launch = LaunchSpec(
        argv=(sys.executable, "-c", SERVER), env=(), host="127.0.0.1", port=free_port(),
        log_path=str(log), startup_timeout_s=10.0, engine="sglang",
    )  # fmt: skip
    info = start_process(launch, grace_s=10.0)
    deadline = time.monotonic() + 30
    while "child up" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    tree = process_tree(info.reaper_pid)
    assert len(tree) == 3  # reaper, server, child
    assert stop_process(info, timeout_s=30)
    text = log.read_text().split("\n", 1)[1]  # past the launch line, which quotes the script
    assert "server got SIGTERM" in text
    assert "child got SIGTERM" not in text, text
    assert parse_exit_status(text) == 0  # the server's own orderly exit
    assert pids_alive(tree) == []
