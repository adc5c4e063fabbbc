"""Starting child processes: the only module of rayspec that calls ``subprocess.Popen``.

No shell is involved anywhere: argv is a list, the environment a mapping, and file descriptors
other than the three standard ones are closed in the child. Two ways in:

- :func:`spawn`: a process its caller owns and watches (``server/_process.py`` starts a
  server's reaper this way; ``testing/_twin.py`` its twin process).
- :func:`run_to_end`: a short program run to its end in a session of its own, its output
  captured; at the timeout, on an interrupt, or after a failed exit its whole process group is
  killed (SIGTERM, a grace period, SIGKILL), so no child outlives it (the NCCL screen's worker
  and its ranks, one run per environment set).

A leaf (the standard library and ``_exceptions`` only), so both the server and the screen
packages use it without importing each other or Ray.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from collections.abc import Sequence
from typing import IO
from typing import Any

from rayspec._exceptions import FailureReason
from rayspec._exceptions import LaunchError

__all__ = ["Finished", "group_members", "run_to_end", "spawn"]

_logger = logging.getLogger(__name__)

_TERM_GRACE_S = 3.0
_GONE_WAIT_S = 5.0

_Stream = int | IO[Any] | None


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    stdin: _Stream = None,
    stdout: _Stream = None,
    stderr: _Stream = None,
    new_session: bool = False,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` (no shell) and return it; the caller owns it.

    Args:
        env: the child's whole environment (default: this process's).
        stdin, stdout, stderr: as ``subprocess.Popen`` takes them.
        new_session: start it in a session (and process group) of its own, so its group can
            be killed whole.

    Raises:
        OSError: it could not be started (e.g. the executable does not exist).
    """
    return subprocess.Popen(
        list(argv),
        env=None if env is None else dict(env),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        start_new_session=new_session,
        close_fds=True,
    )


@dataclasses.dataclass(frozen=True)
class Finished:
    """What :func:`run_to_end` saw.

    Attributes:
        returncode: the exit status; None when it was killed at the timeout.
        stdout, stderr: its output (what came before the kill, for a killed run).
        elapsed_s: from start to end (or to the kill).
    """

    returncode: int | None
    stdout: str
    stderr: str
    elapsed_s: float


def run_to_end(
    argv: Sequence[str], env: Mapping[str, str], timeout_s: float, *, what: str
) -> Finished:
    """Run ``argv`` to its end in its own session, with a limit, and capture its output.

    At ``timeout_s`` (or if this process is interrupted meanwhile: Ctrl-C, a Ray cancel) its
    process group is killed; after a failed exit too, since a failed run may leave children
    behind (the group id is ours).

    Args:
        what: names the program in the error, e.g. ``"the NCCL screen's worker"``.

    Raises:
        LaunchError: it could not be started.
    """
    t0 = time.monotonic()
    try:
        proc = spawn(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            new_session=True,  # its own process group: a hang is killed whole
        )
    except OSError as exc:
        raise LaunchError(
            f"cannot start {what} with {argv[0]!r}: {exc}", reason=FailureReason.UNKNOWN
        ) from exc
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
        returncode: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        _kill_group(proc, what)
        stdout, stderr = _drain(proc)
        returncode = None
    except BaseException:  # interrupted (Ctrl-C, a Ray cancel): take the group down too
        _kill_group(proc, what)
        raise
    if returncode not in (None, 0):
        _kill_group(proc, what)  # a failed run may leave children behind; the group id is ours
    return Finished(
        returncode,
        stdout.decode(errors="replace"),
        stderr.decode(errors="replace"),
        time.monotonic() - t0,
    )


def _kill_group(proc: subprocess.Popen[bytes], what: str) -> None:
    """SIGTERM the run's process group, wait a little, SIGKILL what is left, reap the leader."""
    pgid = proc.pid  # a new session: the leader's pid is the group's id
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
        deadline = time.monotonic() + _TERM_GRACE_S
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    proc.poll()
    deadline = time.monotonic() + _GONE_WAIT_S
    while group_members(pgid):
        if time.monotonic() >= deadline:
            _logger.warning("process group %d of %s still has members", pgid, what)
            return
        time.sleep(0.05)


def group_members(pgid: int) -> list[int]:
    """The live (non-zombie) processes of process group ``pgid``, from /proc.

    A dead child reparented to an init that does not reap stays a zombie: it holds nothing
    (no GPU), so it does not count (``killpg(pgid, 0)`` would count it).
    """
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as fh:
                data = fh.read()
        except OSError:
            continue
        fields = data[data.rfind(")") + 2 :].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            pids.append(int(name))
    return pids


def _drain(proc: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
    try:
        return proc.communicate(timeout=_GONE_WAIT_S)
    except subprocess.TimeoutExpired:  # a pipe held by a process outside the group
        proc.kill()
        return b"", b""
