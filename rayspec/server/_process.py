"""Starting and stopping a server process tree (started through ``rayspec._popen``, the only
module of rayspec that calls Popen).

A server never runs as a direct child of its owner (the Ray actor). :func:`start_process`
starts the detached reaper of :mod:`rayspec.server._reaper`, which starts the server and tears
its whole tree down when the owner dies, when the server exits, or when :func:`stop_process`
asks. No shell is involved anywhere: argv is a list and the environment travels as JSON.

Example::

    info = start_process(launch)            # returns once the server process exists
    try:
        ...                                 # poll readiness over HTTP
    finally:
        stop_process(info, timeout_s=20.0)  # the whole tree is gone when this returns True
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import select
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from rayspec._exceptions import FailureReason
from rayspec._exceptions import LaunchError
from rayspec._popen import spawn
from rayspec.server import _reaper

if TYPE_CHECKING:
    from rayspec._types import LaunchSpec
from rayspec.server._files import with_files

_logger = logging.getLogger(__name__)

_REAPER_SCRIPT = _reaper.__file__
_HANDSHAKE_TIMEOUT_S = 30.0


@dataclasses.dataclass(frozen=True)
class ProcessInfo:
    """A started server: the reaper that owns it, the server itself, and its log.

    Attributes:
        reaper_pid: the detached reaper; its exit means the whole tree is gone.
        server_pid: the process started from ``LaunchSpec.argv`` (a child of the reaper).
        log_path: the file that receives the server's stdout and stderr.
        started_unix_s: when the server was started.
    """

    reaper_pid: int
    server_pid: int
    log_path: str
    started_unix_s: float


def server_environment(
    launch: LaunchSpec, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The exact environment the server gets: ``base`` (default ``os.environ``) plus
    ``launch.env``, minus ``launch.unset_env``.

    Raises:
        LaunchError: a variable name is not a valid identifier, a value holds a NUL byte, or
            a name is both set and unset.
    """
    env = dict(os.environ if base is None else base)
    updates = launch.env_dict
    for name in (*updates, *launch.unset_env):
        if not (name.isascii() and name.isidentifier()):
            raise LaunchError(
                f"invalid environment variable name {name!r}: use letters, digits and "
                "underscores, not starting with a digit",
                reason=FailureReason.INFEASIBLE,
            )
    for name, value in updates.items():
        if "\0" in value:
            raise LaunchError(
                f"environment variable {name} holds a NUL byte", reason=FailureReason.INFEASIBLE
            )
    both = sorted(set(updates) & set(launch.unset_env))
    if both:
        raise LaunchError(
            f"environment variables both set and unset: {', '.join(both)}",
            reason=FailureReason.INFEASIBLE,
        )
    for name in launch.unset_env:
        env.pop(name, None)
    env.update(updates)
    return env


def check_port_free(host: str, port: int) -> None:
    """Raise :class:`LaunchError` if something already listens on ``host:port``.

    The probe binds with ``SO_REUSEADDR``, as uvicorn does, so a port in TIME_WAIT counts
    as free and only a live listener (or a foreign bind) counts as taken.
    """
    if not 0 < port < 65536:
        raise LaunchError(f"port {port} is out of range 1..65535", reason=FailureReason.INFEASIBLE)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise LaunchError(
            f"cannot resolve server host {host!r}: {exc}", reason=FailureReason.INFEASIBLE
        ) from exc
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(addr)
        except OSError as exc:
            in_use = exc.errno == errno.EADDRINUSE
            raise LaunchError(
                f"port {port} on {host} is already in use ({exc.strerror}); stop whatever "
                "listens there or choose another port"
                if in_use
                else f"cannot listen on {host}:{port} ({exc.strerror})",
                # Not the candidate's fault either way.
                reason=FailureReason.PORT_IN_USE if in_use else FailureReason.UNKNOWN,
            ) from exc


PORT_WAIT_S = 30.0


def wait_port_free(host: str, port: int, timeout_s: float | None = None) -> None:
    """Wait (bounded) for ``host:port`` to be free, then return; raise if it stays taken.

    On a cluster Ray frees a trial's GPUs as soon as its actor dies, while the previous
    server's reaper may still be stopping it (up to its grace period): the next trial on that
    node waits for the port rather than failing at once.
    """
    deadline = time.monotonic() + (PORT_WAIT_S if timeout_s is None else timeout_s)
    while True:
        try:
            check_port_free(host, port)
            return
        except LaunchError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.25)


def start_process(
    launch: LaunchSpec,
    owner_pid: int | None = None,
    grace_s: float = 10.0,
    base_env: Mapping[str, str] | None = None,
    niceness: int | None = None,
) -> ProcessInfo:
    """Start ``launch.argv`` under a detached reaper, output to ``launch.log_path``.

    The log file is truncated and begins with one ``[rayspec] launch:`` line naming the
    command. The server's environment is :func:`server_environment` of the caller's.

    Args:
        launch: what to run.
        owner_pid: the process whose death tears the server down (default: this process).
        grace_s: how long the reaper waits after SIGTERM before it SIGKILLs the tree.
        base_env: the environment ``launch.env`` applies to (default ``os.environ``).
        niceness: the niceness the reaper and the server run at (default: the caller's). An
            actor passes the node's: Ray runs its workers at 15.

    Returns:
        The pids and the log path, once the server process exists.

    Raises:
        LaunchError: the port is taken, the environment is invalid, the log cannot be
            written, or the reaper could not start the command (e.g. the executable does not
            exist).
    """
    if not launch.argv:
        raise LaunchError("empty argv", reason=FailureReason.INFEASIBLE)
    if launch.files:  # on the node: the files beside the log, their paths after argv
        log_file = Path(launch.log_path)
        try:
            launch = with_files(launch, str(log_file.parent), log_file.stem)
        except OSError as exc:
            raise LaunchError(
                f"cannot write the launch's files beside {str(log_file)!r}: {exc}",
                reason=FailureReason.UNKNOWN,
            ) from exc
    env = server_environment(launch, base_env)
    wait_port_free(launch.host, launch.port)
    log = Path(launch.log_path)
    try:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as fh:
            fh.write(f"[rayspec] launch: {shlex.join(launch.argv)}\n".encode())
    except OSError as exc:
        raise LaunchError(
            f"cannot write the server log {str(log)!r}: {exc.strerror or exc}",
            reason=FailureReason.UNKNOWN,
        ) from exc
    cmd = [
        sys.executable,
        "-I",
        "-S",
        _REAPER_SCRIPT,
        str(os.getpid() if owner_pid is None else owner_pid),
        repr(float(grace_s)),
        str(log),
        "-" if niceness is None else str(int(niceness)),
        "--",
        *launch.argv,
    ]
    try:
        with open(log, "ab") as err:
            proc = spawn(  # the reaper's own env: ours, untouched
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err
            )
    except OSError as exc:
        raise LaunchError(
            f"cannot start the reaper ({sys.executable}): {exc}", reason=FailureReason.UNKNOWN
        ) from exc
    try:
        out, _ = proc.communicate(json.dumps(env).encode(), timeout=_HANDSHAKE_TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        proc.kill()
        proc.wait()
        raise LaunchError(
            f"the reaper did not answer within {_HANDSHAKE_TIMEOUT_S:g} s",
            reason=FailureReason.STARTUP_CRASH,
        ) from exc
    line = out.decode(errors="replace").strip()
    parts = line.split()
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise LaunchError(
            f"could not start {launch.argv[0]!r}: {line or 'the reaper exited silently'}",
            reason=FailureReason.STARTUP_CRASH,
            returncode=proc.returncode if proc.returncode else None,
        )
    info = ProcessInfo(int(parts[0]), int(parts[1]), str(log), time.time())
    _logger.debug("started server pid %d under reaper pid %d", info.server_pid, info.reaper_pid)
    return info


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, ppid) of ``pid`` from /proc, or None if it does not exist."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            data = fh.read()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2 :].split()
    return fields[0], int(fields[1])


def is_alive(info: ProcessInfo) -> bool:
    """Whether the server process still runs (a zombie, or a reused pid, counts as dead)."""
    st = _stat(info.server_pid)
    return st is not None and st[0] not in ("Z", "X") and st[1] == info.reaper_pid


def reaper_alive(info: ProcessInfo) -> bool:
    """Whether the reaper (and so possibly part of the tree) still exists."""
    st = _stat(info.reaper_pid)
    return st is not None and st[0] not in ("Z", "X")


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants that exist now (empty if ``pid`` is gone)."""
    if _stat(pid) is None:
        return []
    return [pid, *_reaper.descendants(pid)]


def _open_reaper(info: ProcessInfo) -> int | None:
    """A pidfd on the reaper, or None if it is gone.

    The pidfd pins the process; the command-line check that follows makes sure it is still our
    reaper and not a stranger that reused the pid after the reaper exited.
    """
    try:
        fd = os.pidfd_open(info.reaper_pid)
    except ProcessLookupError:
        return None
    try:
        with open(f"/proc/{info.reaper_pid}/cmdline", "rb") as fh:
            args = fh.read().split(b"\0")
    except OSError:
        args = []
    if os.fsencode(_REAPER_SCRIPT) in args and os.fsencode(info.log_path) in args:
        return fd
    os.close(fd)
    return None


def stop_process(info: ProcessInfo, timeout_s: float = 20.0) -> bool:
    """Ask the reaper to tear the tree down, and wait for it.

    The reaper SIGTERMs the tree, waits its grace period and SIGKILLs the rest. If the reaper
    itself has not exited within ``timeout_s``, every process left in its tree is SIGKILLed
    from here.

    Returns:
        True if the reaper exited within ``timeout_s`` (the normal case).
    """
    fd = _open_reaper(info)
    if fd is None:
        return True  # already gone: the server exited and the reaper cleaned up
    try:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(fd, signal.SIGTERM)
        if select.select([fd], [], [], timeout_s)[0]:
            return True
        _logger.warning(
            "reaper %d did not exit within %g s; SIGKILLing its tree", info.reaper_pid, timeout_s
        )
        for pid in reversed(process_tree(info.reaper_pid)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        select.select([fd], [], [], 5.0)
        return False
    finally:
        os.close(fd)


def _listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on TCP ``port`` (IPv4 and IPv6), from /proc/net."""
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as fh:
                next(fh, None)  # header
                for line in fh:
                    fields = line.split()
                    # local_address is HEXIP:HEXPORT; state 0A is LISTEN.
                    if len(fields) > 9 and fields[3] == "0A":
                        if int(fields[1].rsplit(":", 1)[1], 16) == port:
                            inodes.add(fields[9])
        except OSError:
            continue
    return inodes


def owns_listener(info: ProcessInfo, port: int) -> bool | None:
    """Whether the server's process tree holds the socket listening on ``port``.

    A readiness probe answered by some other process on the same port (a server left by
    someone else, a second study on the same ports) must not count as our server being ready.

    Returns:
        True or False; None when it cannot be told (no listener visible in /proc/net).
    """
    inodes = _listening_inodes(port)
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for pid in process_tree(info.server_pid):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    return True
            except OSError:
                continue
    return False
