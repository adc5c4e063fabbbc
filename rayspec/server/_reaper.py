"""The detached reaper that sits between a server actor and its server process tree.

Usage (started only by :func:`rayspec.server._process.start_process`)::

    python -I -S _reaper.py OWNER_PID GRACE_S LOG_PATH NICE -- argv...

The server's complete environment arrives as one JSON object on stdin (never on the command
line, never through a shell). The reaper answers with one line on stdout,
``"<reaper_pid> <server_pid>"`` (or ``"error <message>"``), and from then on writes nothing
but the log.

Why it exists (measured with Ray 2.60): Ray kills only an actor's *direct*
children, so a server started straight from the actor leaks its grandchildren (SGLang's TP
workers, and their GPU memory) on ``ray.kill`` or a driver crash. The reaper

1. double-forks, so the surviving reaper is not a direct child of the Ray worker;
2. calls ``setsid()``, so the server shares the reaper's fresh process group;
3. sets ``PR_SET_CHILD_SUBREAPER``, so orphaned descendants (even ones that called ``setsid``
   themselves) are reparented to it rather than to PID 1;
4. holds a pidfd on the owner (opened before the fork, while the owner is surely alive), a
   pidfd on the server and a signal wakeup pipe, and waits on all three;
5. when any fires (owner died, server exited, SIGTERM/SIGINT/SIGHUP), SIGTERMs the server (and,
   once the server is gone, whatever is left of its tree), reaps for up to GRACE_S, SIGKILLs
   what is left and exits;
6. sets its own niceness to NICE (``-`` keeps it) before it starts the server. Ray starts its
   workers at niceness 15 (``RAY_worker_niceness``), and a reaper started from an actor would
   pass that to the server: the server measured at a priority ``best.sh`` never runs it at, and,
   on a busy node, a teardown starved for tens of seconds (a server outliving its driver). The
   actor passes the node's niceness (the raylet's). Lowering it needs ``CAP_SYS_NICE`` or an
   ``RLIMIT_NICE`` that allows it; without, the log says so in one line and the server runs on.

When the server exits, the reaper appends :data:`EXIT_LINE_PREFIX` plus the return code
(``subprocess``'s convention: negative for a signal) to the log, so failures can be
classified. This module uses the standard library only and imports nothing from rayspec: it
runs as a plain script so that starting it costs no package import.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import sys
import time

EXIT_LINE_PREFIX = "[rayspec-reaper] server exited with returncode "
NOTE_PREFIX = "[rayspec-reaper] "
_PR_SET_CHILD_SUBREAPER = 36
_POLL_S = 0.05
_RESET_SIGNALS = (
    signal.SIGPIPE,
    signal.SIGXFSZ,
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
)


def descendants(pid: int) -> list[int]:
    """All descendants of ``pid``, from the procfs ``children`` lists (empty if it vanished)."""
    kids: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as fh:
                kids += [int(k) for k in fh.read().split()]
        except OSError:
            continue
    return kids + [d for k in kids for d in descendants(k)]


def _signal_tree(sig: int) -> None:
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


class _Reaper:
    def __init__(self, log_fd: int, server_pid: int) -> None:
        self.log_fd = log_fd
        self.server_pid = server_pid
        self.server_status: int | None = None

    def note(self, text: str) -> None:
        os.write(self.log_fd, f"{NOTE_PREFIX}{text}\n".encode())

    def reap(self) -> None:
        """Collect every exited child; record the server's status the moment it is reaped."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.server_pid and self.server_status is None:
                self.server_status = status
                code = os.waitstatus_to_exitcode(status)
                os.write(self.log_fd, f"{EXIT_LINE_PREFIX}{code}\n".encode())

    def teardown(self, grace_s: float) -> None:
        # SIGTERM to the server alone while it lives: SGLang stops its own children (scheduler,
        # detokenizer) on SIGTERM, and a SIGTERM that reaches a child first looks to it like a
        # crashed child ("Subprocess scheduler_0 ... crashed with exit code -15"): 5 s of crash
        # diagnostics (py-spy and a CUDA coredump of schedulers still alive), then it SIGKILLs
        # itself. What the server leaves behind gets SIGTERM once it is gone.
        rest_signalled = self.server_status is not None
        if rest_signalled:
            _signal_tree(signal.SIGTERM)
        else:
            try:
                os.kill(self.server_pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        end = time.monotonic() + grace_s
        while time.monotonic() < end:
            self.reap()
            if not descendants(os.getpid()):
                return
            if self.server_status is not None and not rest_signalled:
                _signal_tree(signal.SIGTERM)
                rest_signalled = True
            time.sleep(_POLL_S)
        left = descendants(os.getpid())
        if left:
            self.note(f"SIGKILL after {grace_s:g} s grace: pids {left}")
        _signal_tree(signal.SIGKILL)
        end = time.monotonic() + 5.0
        while time.monotonic() < end:
            self.reap()
            if not descendants(os.getpid()):
                return
            time.sleep(_POLL_S)


def _renice(nice: str) -> str | None:
    """Set this process's niceness to ``nice`` (``-``: keep it); a note if it could not."""
    if nice == "-":
        return None
    target, now = int(nice), os.getpriority(os.PRIO_PROCESS, 0)
    if target == now:
        return None
    try:
        os.setpriority(os.PRIO_PROCESS, 0, target)
    except OSError as exc:
        return (
            f"the server runs at niceness {now}, not the node's {target} "
            f"(lowering it needs CAP_SYS_NICE or RLIMIT_NICE: {exc.strerror})"
        )
    return None


def main(args: list[str]) -> int:
    owner_pid, grace_s, log_path, nice = int(args[0]), float(args[1]), args[2], args[3]
    argv = args[args.index("--") + 1 :]
    env = json.loads(sys.stdin.read())
    if not argv:
        print("error empty argv", flush=True)
        return 2
    try:
        owner = os.pidfd_open(owner_pid)  # before the fork: the owner is surely alive now
    except ProcessLookupError:
        print(f"error owner process {owner_pid} is gone", flush=True)
        return 1
    if os.fork():
        os._exit(0)  # the owner's direct child leaves at once
    os.setsid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(
            f"error prctl(PR_SET_CHILD_SUBREAPER) failed: errno {ctypes.get_errno()}", flush=True
        )
        os._exit(1)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    unniced = _renice(nice)  # before the server exists: it inherits the niceness
    if unniced:
        os.write(log_fd, f"{NOTE_PREFIX}{unniced}\n".encode())
    null_fd = os.open(os.devnull, os.O_RDONLY)
    actions = [
        (os.POSIX_SPAWN_DUP2, null_fd, 0),
        (os.POSIX_SPAWN_DUP2, log_fd, 1),
        (os.POSIX_SPAWN_DUP2, log_fd, 2),
    ]
    # Install the handlers before the server exists, so a stop that arrives at once is seen.
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, lambda *_: None)
    try:
        # setpgroup/setsid left unset: the server stays in the reaper's group (pgid == reaper).
        # setsigdef: Python ignores SIGPIPE and the owner may ignore SIGINT; the server must not
        # inherit either (subprocess's restore_signals does the same).
        server_pid = os.posix_spawnp(
            argv[0], argv, env, file_actions=actions, setsigdef=_RESET_SIGNALS, setsigmask=()
        )
    except OSError as exc:
        os.write(log_fd, f"{NOTE_PREFIX}cannot start {argv[0]!r}: {exc}\n".encode())
        print(f"error cannot start {argv[0]!r}: {exc}", flush=True)
        os._exit(127)
    server = os.pidfd_open(server_pid)  # our child: it cannot vanish before we reap it
    reaper = _Reaper(log_fd, server_pid)
    print(f"{os.getpid()} {server_pid}", flush=True)
    # From here on the reaper's own stdout/stderr go to the log too (closes the pipe to the owner).
    os.dup2(null_fd, 0)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    ready, _, _ = select.select([owner, server, r], [], [])
    if server in ready:
        reaper.reap()
        why = "server exited"
    elif owner in ready:
        why = f"owner process {owner_pid} died"
    else:
        why = "stop requested"
    if why != "server exited":
        reaper.note(f"{why}: stopping the server tree")
    reaper.teardown(grace_s)
    reaper.reap()
    if why == "server exited":
        reaper.note("server tree gone")
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
