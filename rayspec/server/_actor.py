"""ServerActor: the Ray actor that holds a node's GPUs while one trial's server runs."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING
from typing import Any

import ray

from rayspec._exceptions import FailureReason
from rayspec._exceptions import LaunchError
from rayspec.server._backends import backend_for

if TYPE_CHECKING:
    from collections.abc import Mapping

    from rayspec._types import LaunchSpec
    from rayspec.server._base import BaseServerBackend

_GPU_VAR = "CUDA_VISIBLE_DEVICES"
# What a Ray worker has that the node does not (measured on 2.60): never the server's business.
_RAY_WORKER_ONLY = (
    "OMP_NUM_THREADS",  # Ray forces 1 on a num_cpus=0 actor; SGLang must see the node's value
    "PYTHONBREAKPOINT",
    "RAY_JOB_ID",
    "RAY_LD_PRELOAD_ON_WORKERS",
    "RAY_RAYLET_PID",
    "SPT_NOENV",
)


def _read_environ(pid: str | None) -> dict[str, str] | None:
    if not pid or not pid.isdigit():
        return None
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            data = fh.read()
    except OSError:
        return None
    env = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[os.fsdecode(key)] = os.fsdecode(value)
    return env


def node_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The worker's environment without what Ray adds to its workers only.

    A name of ``_RAY_WORKER_ONLY`` is kept only if the raylet (whose environment is the node's,
    read from ``/proc/$RAY_RAYLET_PID/environ``) has the same value. If the raylet's
    environment cannot be read, the Ray-internal names are dropped, ``PYTHONBREAKPOINT`` is
    dropped if it is Ray's debugger, and ``OMP_NUM_THREADS`` is kept (its origin is unknown).
    Ray's ``CUDA_VISIBLE_DEVICES`` is always kept.
    """
    env = dict(os.environ if environ is None else environ)
    raylet = _read_environ(env.get("RAY_RAYLET_PID"))
    for name in _RAY_WORKER_ONLY:
        if name not in env:
            continue
        if raylet is not None:
            drop = raylet.get(name) != env[name]
        elif name == "OMP_NUM_THREADS":
            drop = False
        elif name == "PYTHONBREAKPOINT":
            drop = env[name].startswith("ray.")
        else:
            drop = True
        if drop:
            del env[name]
    return env


def node_niceness(environ: Mapping[str, str] | None = None) -> int | None:
    """The node's niceness: the raylet's (Ray starts its workers at 15), None if unreadable."""
    pid = (os.environ if environ is None else environ).get("RAY_RAYLET_PID")
    if not pid or not pid.isdigit():
        return None
    try:
        return os.getpriority(os.PRIO_PROCESS, int(pid))
    except OSError:
        return None


@ray.remote(num_cpus=0, max_concurrency=2)  # type: ignore[call-overload]  # stubs lag
class ServerActor:
    """Owns one server backend on the node Ray placed it on.

    Create it with the trial's GPUs, one actor per server, and never reuse it after a timeout
    or a death (``ray.kill`` it and create another)::

        actor = ServerActor.options(num_gpus=tp_size, name=f"server-{trial}").remote()
        ray.get(actor.start.remote(launch))
        info = ray.get(actor.wait_ready.remote())    # raises ServerExited / ServerStartTimeout
        ...
        ray.get(actor.stop.remote())

    The server runs under a detached reaper (see :mod:`rayspec.server._reaper`), so its whole
    process tree goes away on :meth:`stop`, on ``ray.kill(actor)``, when the actor's worker
    dies for any reason, and when the server exits by itself.

    It runs at the node's niceness (the raylet's, :func:`node_niceness`), not at the 15 Ray
    gives its workers. Its environment is the node's as the worker sees it
    (:func:`node_environment`: Ray's ``CUDA_VISIBLE_DEVICES`` kept, Ray's worker-only additions
    such as ``OMP_NUM_THREADS=1`` removed), plus ``LaunchSpec.env``, minus
    ``LaunchSpec.unset_env``. A launch that sets or unsets
    ``CUDA_VISIBLE_DEVICES`` is refused: the GPUs are Ray's to assign.

    Errors reach the caller as the typed :class:`~rayspec.LaunchError` subclasses, with their
    ``reason``, ``returncode`` and ``log_tail`` (Ray wraps them in a ``RayTaskError`` that is
    also an instance of the original class).

    The actor runs up to two calls at once, so :meth:`stop` can interrupt a :meth:`wait_ready`
    in progress.
    """

    def __init__(self, *, grace_s: float | None = None) -> None:
        self._grace_s = grace_s
        self._backend: BaseServerBackend | None = None

    def start(self, launch: LaunchSpec) -> None:
        """Start the server (returns once the process exists). See ``BaseServerBackend.start``."""
        if self._backend is not None:
            raise LaunchError(
                "this ServerActor already started a server; create a new actor per server",
                reason=FailureReason.UNKNOWN,
            )
        if _GPU_VAR in launch.env_dict or _GPU_VAR in launch.unset_env:
            raise LaunchError(
                f"the launch may not set or unset {_GPU_VAR}: Ray assigns the GPUs",
                reason=FailureReason.INFEASIBLE,
            )
        backend = backend_for(
            launch.engine,
            grace_s=self._grace_s,
            owner_pid=os.getpid(),
            base_env=node_environment(),
            # The server runs at the node's priority, as best.sh runs it, not at the worker's.
            niceness=node_niceness(),
        )
        self._backend = backend
        backend.start(launch)

    def wait_ready(self, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait for readiness; returns ``/get_server_info``. See ``BaseServerBackend``."""
        return self._require().wait_ready(timeout_s)

    def flush_cache(self, timeout_s: float = 30.0) -> None:
        """POST ``/flush_cache`` (retried while the server is busy)."""
        self._require().flush_cache(timeout_s)

    def raise_if_dead(self) -> None:
        """Raise the classified ``ServerExited`` if the server has exited."""
        self._require().raise_if_dead()

    def alive(self) -> bool:
        """Whether the server process runs now."""
        return self._backend is not None and self._backend.alive()

    def stop(self) -> int | None:
        """Tear the whole tree down (idempotent); the server's exit status if known."""
        return self._backend.stop() if self._backend is not None else None

    def log_tail(self, n: int = 40) -> str:
        """The last ``n`` lines of the server log."""
        return self._backend.log_tail(n) if self._backend is not None else ""

    def log_path(self) -> str | None:
        """The server log's path on this node."""
        return self._backend.log_path if self._backend is not None else None

    def node_ip(self) -> str:
        """The IP address of the node this actor (and its server) runs on."""
        return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]

    def node_id(self) -> str:
        """The Ray node id of the node this actor runs on (several nodes may share an IP)."""
        return str(ray.get_runtime_context().get_node_id())

    def pids(self) -> list[int]:
        """The reaper's pid and every descendant's, as they exist now (for checks)."""
        tree = getattr(self._backend, "process_tree", None)
        return list(tree()) if tree is not None else []

    def _require(self) -> BaseServerBackend:
        if self._backend is None:
            raise LaunchError("no server was started on this actor", reason=FailureReason.UNKNOWN)
        return self._backend
