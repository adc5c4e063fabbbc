"""The study lock: one driver per study folder, for the driver's whole life.

A second driver on the same study would take the first one's running trials for a killed
driver's (interrupted, queued again) and both would write the same trial numbers. The lock is
``fcntl.flock`` on ``<out>/study.lock``: the kernel drops it when its holder exits, however it
exits (kill -9 included), so a lock left by a dead driver is simply taken over. The file names
its holder (pid, host, start time) for the refusal's message; it is never deleted (deleting a
lock file another process holds open would let a third one lock a new file beside it).

The lock is reentrant within one process: the CLI takes it before its first look at the study
and :func:`~rayspec.tune.run_study` takes it again.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator

from rayspec._exceptions import ConfigError
from rayspec.store import StudyFolder
from rayspec.store import check_folder

__all__ = ["StudyLockedError", "check_unlocked", "study_lock"]

_held: dict[str, tuple[int, int]] = {}  # real path -> (fd, depth): this process's locks
_guard = threading.Lock()


class StudyLockedError(ConfigError):
    """Another live driver holds the study's lock."""


def _path(out_dir: str) -> str:
    return os.path.realpath(StudyFolder(out_dir).lock)


def _holder(fd: int) -> str:
    """``pid 123 on host h since 2026-12-01 18:00:00 UTC`` from the lock file ("" unknown)."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        info = json.loads(os.read(fd, 4096) or b"{}")
        since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(info["start_unix_s"])))
        return f"pid {int(info['pid'])} on host {info['host']} since {since}"
    except (OSError, ValueError, KeyError, TypeError):
        return ""


def _refusal(out_dir: str, holder: str) -> StudyLockedError:
    who = holder or "another process"
    return StudyLockedError(
        f"output.dir: study folder {out_dir} is in use by another rayspec driver ({who}); "
        "wait for it to end or stop it, or choose another study.name or output.dir"
    )


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def check_unlocked(out_dir: str) -> None:
    """Refuse early when a live driver holds the study, writing nothing (preflight).

    Raises:
        StudyLockedError: one line naming the holder.
    """
    path = _path(out_dir)
    if path in _held or not os.path.exists(path):
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # unreadable here: the real acquisition says what is wrong
    try:
        if not _try_lock(fd):
            raise _refusal(out_dir, _holder(fd))
    finally:
        os.close(fd)  # closing drops a probe's lock


@contextlib.contextmanager
def study_lock(out_dir: str, printer: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the study folder's lock while the block runs (reentrant in one process).

    Raises:
        StudyLockedError: a live driver holds it (one line naming its pid, host, start time).
    """
    path = _path(out_dir)
    with _guard:
        if path in _held:
            fd, depth = _held[path]
            _held[path] = (fd, depth + 1)
            fresh = False
        else:
            fresh = True
    if fresh:
        check_folder(out_dir)  # links out, unwritable folders: one line, before any write
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            if not _try_lock(fd):
                raise _refusal(out_dir, _holder(fd))
            stale = _holder(fd)
            if stale and printer is not None:
                printer(f"study lock: taken over from a driver that is gone ({stale})")
            info = {"pid": os.getpid(), "host": socket.gethostname(), "start_unix_s": time.time()}
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        with _guard:
            _held[path] = (fd, 1)
    try:
        yield
    finally:
        with _guard:
            fd, depth = _held[path]
            if depth > 1:
                _held[path] = (fd, depth - 1)
            else:
                del _held[path]
                try:
                    os.ftruncate(fd, 0)  # released cleanly: no holder to name
                finally:
                    os.close(fd)
