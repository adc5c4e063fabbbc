"""The interface every server backend implements (real SGLang, the twin)."""

from __future__ import annotations

import abc
import enum
from typing import TYPE_CHECKING
from typing import Any

if TYPE_CHECKING:
    from types import TracebackType

    from rayspec._types import LaunchSpec


class ServerState(str, enum.Enum):
    """Where a backend is in its one-way life: NEW -> RUNNING -> STOPPED."""

    NEW = "new"
    RUNNING = "running"  # started (ready or not, alive or not) and not yet stopped
    STOPPED = "stopped"


class BaseServerBackend(abc.ABC):
    """One server process tree, started once and torn down once.

    Lifecycle (a backend is never reused; a new trial gets a new backend):

    1. :meth:`start` (NEW -> RUNNING) launches the process and returns at once.
    2. :meth:`wait_ready` polls until the server answers, or raises
       :class:`~rayspec.ServerExited` / :class:`~rayspec.ServerStartTimeout` with a classified
       :class:`~rayspec.FailureReason`, the return code and the log tail. After a failure the
       caller must still call :meth:`stop`.
    3. While RUNNING: :meth:`flush_cache`, :meth:`alive`, :meth:`raise_if_dead`,
       :meth:`log_tail`.
    4. :meth:`stop` (any state -> STOPPED) tears the whole process tree down; it is
       idempotent. Using a backend as a context manager calls it on exit.

    A second :meth:`start` raises :class:`~rayspec.LaunchError`, whatever the state.

    Thread safety: :meth:`stop` may be called from another thread while :meth:`wait_ready`
    runs (a threaded Ray actor does this); :meth:`wait_ready` then raises
    :class:`~rayspec.LaunchError` with reason ``INTERRUPTED``. Other calls are not meant to
    run concurrently.
    """

    #: The ``LaunchSpec.engine`` value this backend serves.
    engine: str = ""

    @property
    @abc.abstractmethod
    def state(self) -> ServerState:
        """The lifecycle state."""

    @property
    @abc.abstractmethod
    def log_path(self) -> str | None:
        """The server log (None before :meth:`start`)."""

    @abc.abstractmethod
    def start(self, launch: LaunchSpec) -> None:
        """Launch the server described by ``launch`` and return without waiting.

        Raises:
            LaunchError: the backend was started before, ``launch`` is for another engine, the
                port is taken, or the process could not be started.
        """

    @abc.abstractmethod
    def wait_ready(self, timeout_s: float | None = None, poll_s: float = 0.25) -> dict[str, Any]:
        """Poll until the server is ready and return its ``/get_server_info`` document.

        Args:
            timeout_s: overrides ``LaunchSpec.startup_timeout_s``.
            poll_s: pause between readiness probes.

        Raises:
            ServerExited: the server exited before it became ready.
            ServerStartTimeout: it was not ready within the timeout (it is still running;
                call :meth:`stop`).
            LaunchError: not started, or stopped while waiting (reason ``INTERRUPTED``).
        """

    @abc.abstractmethod
    def flush_cache(self, timeout_s: float = 30.0) -> None:
        """Clear the server's caches and speculative counters (``/flush_cache``).

        Raises:
            ServerExited: the server is dead (reason ``CRASH_MID_BENCHMARK`` or more specific).
            LaunchError: the server kept refusing (busy) for ``timeout_s``.
        """

    @abc.abstractmethod
    def alive(self) -> bool:
        """Whether the server process is running now."""

    @abc.abstractmethod
    def raise_if_dead(self) -> None:
        """Raise :class:`~rayspec.ServerExited`, classified, if the server has exited."""

    @abc.abstractmethod
    def stop(self) -> int | None:
        """Tear the whole process tree down (idempotent); the server's exit status if known."""

    @abc.abstractmethod
    def log_tail(self, n: int = 40) -> str:
        """The last ``n`` lines of the server log ("" before :meth:`start`)."""

    def __enter__(self) -> BaseServerBackend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
