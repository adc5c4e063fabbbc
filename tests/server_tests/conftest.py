"""Helpers for the server tests: a launch of the fake server on a free port."""

from __future__ import annotations

import os
import re
import select
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rayspec._types import LaunchSpec
from rayspec.server._process import ProcessInfo
from rayspec.server._process import _open_reaper
from tests.helpers import free_port
from tests.helpers import pids_alive

FAKE_SERVER = str(Path(__file__).with_name("fake_server.py"))


def wait_reaper(info: ProcessInfo, timeout_s: float) -> bool:
    """Wait until the reaper has exited (then the whole tree is gone); True if it has, or if
    the pid is no longer our reaper (a stranger reused it)."""
    fd = _open_reaper(info)
    if fd is None:
        return True
    try:
        return bool(select.select([fd], [], [], max(timeout_s, 0.0))[0])
    finally:
        os.close(fd)


def fake_pids(log_path: str) -> dict[str, int]:
    """The ``FAKE_PID role=pid`` lines the fake server printed."""
    text = Path(log_path).read_text()
    return {role: int(pid) for role, pid in re.findall(r"FAKE_PID (\w+)=(\d+)", text)}


def wait_gone(pids: list[int], timeout_s: float = 10.0) -> list[int]:
    """Poll /proc until every pid is gone (zombies count as gone); the survivors."""
    end = time.monotonic() + timeout_s
    while True:
        alive = pids_alive(pids)
        if not alive or time.monotonic() > end:
            return alive
        time.sleep(0.05)


@pytest.fixture
def make_launch(tmp_path: Path) -> Callable[..., LaunchSpec]:
    def make(
        *args: str,
        engine: str = "sglang",
        env: dict[str, str] | None = None,
        unset_env: tuple[str, ...] = (),
        timeout_s: float = 20.0,
        port: int | None = None,
        name: str = "server.log",
    ) -> LaunchSpec:
        port = free_port() if port is None else port
        return LaunchSpec(
            argv=(sys.executable, FAKE_SERVER, "--port", str(port), *args),
            env=tuple(sorted((env or {}).items())),
            unset_env=unset_env,
            host="127.0.0.1",
            port=port,
            log_path=str(tmp_path / name),
            startup_timeout_s=timeout_s,
            engine=engine,
        )

    return make
