"""The SGLang version probe runs through rayspec's one process owner (rayspec/_popen.py)."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from rayspec.engines.sglang import _probe


def _fake_python(tmp_path: Path, body: str) -> str:
    path = tmp_path / "python"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper has died)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_a_hanging_import_is_killed_at_the_timeout_with_its_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "child.pid"
    # The "interpreter" leaves a child behind and hangs: both must go at the timeout.
    python = _fake_python(tmp_path, f"sleep 60 & echo $! > {marker}\nsleep 60")
    monkeypatch.setattr(_probe, "SGLANG_IMPORT_TIMEOUT_S", 1.0)
    found = _probe.probe_sglang(python, env={"PATH": os.environ.get("PATH", "")})
    assert found.version is None
    assert "did not finish within 1 s" in found.error
    child = int(marker.read_text())
    for _ in range(50):  # the kill is sent; the child may take a moment to die
        if not _alive(child):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the probe's child {child} outlived the timeout")


def test_an_interpreter_that_cannot_run_is_one_reason(tmp_path: Path) -> None:
    found = _probe.probe_sglang(str(tmp_path / "no-such-python"))
    assert found.error.startswith("cannot run it (")
