"""Server backends: real SGLang and the digital twin, both run as a reaped process tree.

The two differ only in what they accept: the backend is chosen by ``LaunchSpec.engine``, an
``sglang`` launch whose argv runs the twin is refused, and a ``twin`` launch whose argv does
not run the twin is refused, so real SGLang is never silently replaced by the simulation.

Example::

    backend = backend_for(launch.engine)
    with backend:
        backend.start(launch)
        info = backend.wait_ready()          # dict of /server_info
        backend.flush_cache()
        ...                                  # benchmark against launch.base_url
    # the whole process tree is gone here
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from typing import TYPE_CHECKING
from typing import Any

import httpx

from rayspec._exceptions import FailureReason
from rayspec._exceptions import LaunchError
from rayspec._exceptions import ServerExited
from rayspec._exceptions import ServerStartTimeout
from rayspec._tls import shared_ssl_context
from rayspec.engines import SGLANG
from rayspec.engines import TWIN
from rayspec.engines import Engine
from rayspec.engines import Phase
from rayspec.server import _process
from rayspec.server._base import BaseServerBackend
from rayspec.server._base import ServerState
from rayspec.server._logparse import parse_exit_status

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rayspec._types import LaunchSpec

_logger = logging.getLogger(__name__)

_CLASSIFY_BYTES = 1024 * 1024  # enough to see past a long run of readiness-probe lines
_EXIT_LINE_WAIT_S = 3.0  # how long to wait for the reaper's exit line after a death
_PROBE_TIMEOUT_S = 10.0


def read_log_tail(path: str | None, max_bytes: int = _CLASSIFY_BYTES) -> str:
    """The last ``max_bytes`` of a log file as text ("" if it does not exist)."""
    if not path:
        return ""
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except FileNotFoundError:
        return ""
    return data.decode(errors="replace")


# The access-log lines of rayspec's own readiness probes (uvicorn's and aiohttp's formats):
# four a second, they would push the server's last startup line out of a failure's tail.
_PROBE_LINE = re.compile(
    r'"(GET|POST) (' + "|".join(map(re.escape, SGLANG.endpoints.probed)) + r")[ ?]"
)


# uvicorn's line when the HTTP port is taken. Real SGLang 0.5.23 does not exit after it: it logs
# "Waiting for application shutdown." and hangs, alive, with its scheduler and detokenizer, so
# readiness would only fail at the startup timeout (30 min by default) without this line.
_BIND_ERROR = re.compile(r"error while attempting to bind on address .*")
_BIND_SCAN_S = 1.0  # how often readiness looks for it in the log


def _server_text(text: str) -> str:
    """The log without rayspec's own lines (the launch line, the reaper's): what the server
    said. The launch line quotes the argv, and a value in it (a path, a flag's text) must not
    read as the server's error."""
    return "\n".join(ln for ln in text.splitlines() if not ln.startswith("[rayspec"))


def _last_lines(text: str, n: int) -> str:
    lines = [ln for ln in text.splitlines() if not _PROBE_LINE.search(ln)]
    return "\n".join(lines[-n:]) if n > 0 else ""


class _ProcessBackend(BaseServerBackend):
    """A server started through :mod:`rayspec.server._process` and probed over HTTP."""

    #: default seconds between the reaper's SIGTERM and SIGKILL
    default_grace_s: float = 10.0
    #: the engine object: its endpoints and how its log reads
    engine_object: Engine = SGLANG

    def __init__(
        self,
        *,
        grace_s: float | None = None,
        owner_pid: int | None = None,
        base_env: Mapping[str, str] | None = None,
        niceness: int | None = None,
        tail_lines: int = 40,
    ) -> None:
        """Create a backend in state NEW.

        Args:
            grace_s: seconds between SIGTERM and SIGKILL of the tree at teardown.
            owner_pid: the process whose death tears the server down (default: this one).
            base_env: the environment ``LaunchSpec.env`` applies to (default ``os.environ``
                at start).
            niceness: the niceness the server runs at (default: this process's).
            tail_lines: how many log lines the raised errors carry.
        """
        self._grace_s = self.default_grace_s if grace_s is None else float(grace_s)
        if self._grace_s < 0:
            raise ValueError(f"grace_s must be >= 0, got {grace_s}")
        self._owner_pid = owner_pid
        self._base_env = dict(base_env) if base_env is not None else None
        self._niceness = niceness
        self._tail_lines = tail_lines
        self._state = ServerState.NEW
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._launch: LaunchSpec | None = None
        self._info: _process.ProcessInfo | None = None
        self._ready = False
        self._returncode: int | None = None

    # -- introspection -----------------------------------------------------------------------

    @property
    def state(self) -> ServerState:
        return self._state

    @property
    def log_path(self) -> str | None:
        return self._launch.log_path if self._launch else None

    @property
    def process_info(self) -> _process.ProcessInfo | None:
        """The reaper and server pids (None before a successful :meth:`start`)."""
        return self._info

    def process_tree(self) -> list[int]:
        """The pids of the reaper and every descendant that exists now."""
        return _process.process_tree(self._info.reaper_pid) if self._info else []

    def log_tail(self, n: int = 40) -> str:
        return _last_lines(read_log_tail(self.log_path, max(64 * 1024, 512 * n)), n)

    def alive(self) -> bool:
        return (
            self._state is ServerState.RUNNING
            and self._info is not None
            and _process.is_alive(self._info)
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def check_launch(self, launch: LaunchSpec) -> None:
        """Refuse a launch this backend must not run.

        Raises:
            LaunchError: ``launch.engine`` is not :attr:`engine`, or argv is another engine's.
        """
        if launch.engine != self.engine:
            raise LaunchError(
                f"{type(self).__name__} runs engine {self.engine!r}, but the launch is for "
                f"{launch.engine!r}; use backend_for({launch.engine!r})",
                reason=FailureReason.INFEASIBLE,
            )

    def start(self, launch: LaunchSpec) -> None:
        with self._lock:
            if self._state is not ServerState.NEW:
                raise LaunchError(
                    f"backend already {self._state.value}: a server backend starts once; "
                    "create a new one for a new server",
                    reason=FailureReason.UNKNOWN,
                )
            self.check_launch(launch)
            self._launch = launch
            try:
                self._info = _process.start_process(
                    launch, self._owner_pid, self._grace_s, self._base_env, self._niceness
                )
            except BaseException:
                self._state = ServerState.STOPPED
                raise
            self._state = ServerState.RUNNING
        _logger.info(
            "started %s server on %s, log %s", self.engine, launch.base_url, self.log_path
        )

    def wait_ready(self, timeout_s: float | None = None, poll_s: float = 0.25) -> dict[str, Any]:
        launch, info = self._require_running()
        timeout = launch.startup_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        next_scan = time.monotonic() + _BIND_SCAN_S
        with httpx.Client(
            base_url=launch.base_url, trust_env=False, verify=shared_ssl_context()
        ) as client:
            while True:
                if self._stopping.is_set():
                    raise LaunchError(
                        "stopped while waiting for readiness", reason=FailureReason.INTERRUPTED
                    )
                if not _process.is_alive(info):
                    raise self._exited_error(Phase.STARTUP)
                if time.monotonic() >= next_scan:
                    next_scan = time.monotonic() + _BIND_SCAN_S
                    self._raise_if_port_taken(launch)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._timeout_error(timeout)
                try:
                    probe_timeout = min(_PROBE_TIMEOUT_S, max(remaining, 0.1))
                    response = client.get(
                        self.engine_object.endpoints.ready, timeout=probe_timeout
                    )
                    # A 200 from another process on our port is not our server being ready.
                    if response.status_code == 200 and (
                        _process.owns_listener(info, launch.port) is not False
                    ):
                        break
                except httpx.TransportError:
                    pass  # not listening yet, or the probe timed out: check again
                self._stopping.wait(min(poll_s, max(deadline - time.monotonic(), 0.0)))
            self._ready = True
            server_info = self._server_info(client)
        _logger.info("%s server ready on %s", self.engine, launch.base_url)
        return server_info

    def flush_cache(self, timeout_s: float = 30.0) -> None:
        launch, _ = self._require_running()
        deadline = time.monotonic() + timeout_s
        last = "no answer"
        flush = self.engine_object.endpoints.flush
        with httpx.Client(
            base_url=launch.base_url, trust_env=False, verify=shared_ssl_context()
        ) as client:
            while True:
                self.raise_if_dead()
                try:
                    response = client.post(flush, timeout=_PROBE_TIMEOUT_S)
                    if response.status_code == 200:
                        return
                    last = f"HTTP {response.status_code}: {response.text[:200]}"
                except httpx.TransportError as exc:
                    last = f"{type(exc).__name__}: {exc}"
                if time.monotonic() >= deadline:
                    raise LaunchError(
                        f"{flush} refused for {timeout_s:g} s ({last})",
                        reason=FailureReason.UNKNOWN,
                        log_tail=self.log_tail(self._tail_lines),
                    )
                time.sleep(0.25)

    def raise_if_dead(self) -> None:
        if self._state is ServerState.RUNNING and self._info and not _process.is_alive(self._info):
            raise self._exited_error(Phase.SERVING if self._ready else Phase.STARTUP)

    def stop(self) -> int | None:
        self._stopping.set()
        with self._lock:
            if self._state is ServerState.STOPPED:
                return self._returncode
            self._state = ServerState.STOPPED
            if self._info is None:
                return None
            if not _process.stop_process(self._info, timeout_s=self._grace_s + 10.0):
                _logger.warning("reaper %d had to be killed from outside", self._info.reaper_pid)
            self._returncode = parse_exit_status(read_log_tail(self.log_path, 64 * 1024))
            return self._returncode

    # -- helpers -----------------------------------------------------------------------------

    def _require_running(self) -> tuple[LaunchSpec, _process.ProcessInfo]:
        if self._state is ServerState.NEW or self._launch is None or self._info is None:
            raise LaunchError("the server was not started", reason=FailureReason.UNKNOWN)
        if self._state is ServerState.STOPPED:
            raise LaunchError("the server was stopped", reason=FailureReason.INTERRUPTED)
        return self._launch, self._info

    def _server_info(self, client: httpx.Client) -> dict[str, Any]:
        problems = []
        for path in self.engine_object.endpoints.info:
            try:
                response = client.get(path, timeout=_PROBE_TIMEOUT_S)
            except httpx.TransportError as exc:
                problems.append(f"{path}: {type(exc).__name__}")
                continue
            if response.status_code == 200:
                try:
                    data = response.json()
                except ValueError:
                    problems.append(f"{path}: not JSON")
                    continue
                if isinstance(data, dict):
                    return data
                problems.append(f"{path}: not an object")
            else:
                problems.append(f"{path}: HTTP {response.status_code}")
        self.raise_if_dead()
        raise LaunchError(
            f"server is ready but gives no server info ({'; '.join(problems)})",
            reason=FailureReason.UNKNOWN,
            log_tail=self.log_tail(self._tail_lines),
        )

    def _raise_if_port_taken(self, launch: LaunchSpec) -> None:
        """Fail at once when the server logged that it cannot listen (a stranger took the
        port after rayspec checked it was free): the server would never become ready."""
        text = read_log_tail(self.log_path, 64 * 1024)
        found = _BIND_ERROR.search(_server_text(text))
        if found is None:
            return
        raise LaunchError(
            f"{self.engine} server cannot listen on port {launch.port}: {found.group(0).strip()} "
            "(something else took the port while the server started)",
            reason=FailureReason.UNKNOWN,  # not the candidate's fault
            log_tail=_last_lines(text, self._tail_lines),
        )

    def _exit_status(self) -> int | None:
        """The exit status from the reaper's log line; waits briefly for the line to land."""
        end = time.monotonic() + _EXIT_LINE_WAIT_S
        while True:
            status = parse_exit_status(read_log_tail(self.log_path, 64 * 1024))
            if status is not None or time.monotonic() >= end:
                return status
            if self._info and not _process.reaper_alive(self._info):
                return parse_exit_status(read_log_tail(self.log_path, 64 * 1024))
            time.sleep(0.05)

    def _exited_error(self, phase: Phase) -> ServerExited:
        returncode = self._exit_status()
        text = read_log_tail(self.log_path)
        reason = self.engine_object.classify_failure(_server_text(text), returncode, phase)
        when = "while serving" if phase is Phase.SERVING else "before it became ready"
        last = next(
            (
                ln
                for ln in reversed(text.splitlines())
                if ln.strip() and not ln.startswith("[rayspec")
            ),
            "",
        )
        return ServerExited(
            f"{self.engine} server exited {when} (returncode {returncode}, {reason.value})"
            + (f": {last.strip()[:300]}" if last else ""),
            reason=reason,
            log_tail=_last_lines(text, self._tail_lines),
            returncode=returncode,
        )

    def _timeout_error(self, timeout_s: float) -> ServerStartTimeout:
        text = read_log_tail(self.log_path)
        reason = self.engine_object.classify_failure(_server_text(text), None, Phase.TIMEOUT)
        return ServerStartTimeout(
            f"{self.engine} server not ready within {timeout_s:g} s ({reason.value})",
            reason=reason,
            log_tail=_last_lines(text, self._tail_lines),
        )


class SGLangBackend(_ProcessBackend):
    """The real ``sglang serve`` / ``python -m sglang.launch_server``.

    SGLang forwards SIGTERM to its scheduler and TP processes, which free GPU memory on exit,
    so the grace before SIGKILL is generous.
    """

    engine = SGLANG.name
    engine_object = SGLANG
    default_grace_s = 15.0

    def check_launch(self, launch: LaunchSpec) -> None:
        super().check_launch(launch)
        if TWIN.runs_module(launch.argv):
            raise LaunchError(
                "an sglang launch must not run the twin (argv runs "
                f"{TWIN.module}); set server.engine: twin to simulate",
                reason=FailureReason.INFEASIBLE,
            )


class TwinBackend(_ProcessBackend):
    """The digital twin, ``python -m rayspec.twin.server`` (one process, no GPU)."""

    engine = TWIN.name
    engine_object = TWIN
    default_grace_s = 5.0

    def check_launch(self, launch: LaunchSpec) -> None:
        super().check_launch(launch)
        if not TWIN.runs_module(launch.argv):
            raise LaunchError(
                f"a twin launch must run {TWIN.module}, got argv {list(launch.argv[:4])}...",
                reason=FailureReason.INFEASIBLE,
            )


_BACKENDS: dict[str, type[_ProcessBackend]] = {
    SGLANG.name: SGLangBackend,
    TWIN.name: TwinBackend,
}


def backend_for(engine: str, **kwargs: Any) -> BaseServerBackend:
    """A new backend for ``LaunchSpec.engine`` (an explicit allow-list: sglang, twin).

    Raises:
        LaunchError: the engine is unknown.
    """
    try:
        cls = _BACKENDS[engine]
    except KeyError:
        raise LaunchError(
            f"unknown server engine {engine!r}; expected one of {sorted(_BACKENDS)}",
            reason=FailureReason.INFEASIBLE,
        ) from None
    return cls(**kwargs)
