"""Connecting to Ray: a private local cluster by default, or the configured address.

A bare ``ray.init()`` would silently join a cluster someone else started, so a local cluster is
always ``address="local"``, and resources are given only when we start it (Ray refuses
``num_cpus``/``num_gpus`` when joining). The private cluster listens on loopback only
(:mod:`rayspec.tune._loopback`), and its workers run at the node's niceness, not Ray's 15
(the bench client times tokens); a joined cluster keeps its own binding, auth and niceness.

The private cluster's processes run in process groups of their own (:func:`apart_from_group`):
a signal to the driver's process group (``timeout``, Slurm's ``scancel``, systemd, a closed
terminal) reaches the driver alone, which stops the servers and then the cluster as on Ctrl-C.
In the driver's group, Ray's GCS and raylet took SIGTERM at the same moment and shut down
half-way, so the driver could no longer stop its actors: it hung for the rest of the trial's
benchmark, or 60 s until Ray gave up on its GCS and aborted it with exit code 1.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from rayspec._config import Engine
from rayspec._config import ExperimentConfig
from rayspec._exceptions import ConfigError
from rayspec._exceptions import RayspecError
from rayspec._plural import plural
from rayspec.tune._loopback import LOOPBACK
from rayspec.tune._loopback import is_loopback
from rayspec.tune._loopback import loopback_node
from rayspec.tune._loopback import loopback_supported

__all__ = ["ClusterHandle", "connect", "disconnect", "room"]

# What a trial's ServerActor asks of cluster.node_resource: a sliver, so it only selects nodes
# (the GPUs are what limits trials per node).
NODE_RESOURCE_SHARE = 0.001


@dataclass(frozen=True)
class ClusterHandle:
    address: str
    local: bool
    gpus: float
    slots: int
    dashboard_url: str
    tp_size: int = 1
    node_resource: str = ""
    max_concurrent_trials: int = 0
    nodes: int = 1

    def describe(self) -> str:
        where = "local Ray cluster" if self.local else f"Ray cluster at {self.address}"
        dash = f"; Ray dashboard: http://{self.dashboard_url}" if self.dashboard_url else ""
        at_once = plural(self.slots, "trial")
        nodes = ""
        if self.nodes != 1 or self.node_resource:
            with_res = f" with {self.node_resource}" if self.node_resource else ""
            nodes = f"{plural(self.nodes, 'node')}{with_res}, "
        return f"{where}: {nodes}{plural(self.gpus, 'GPU')}, {at_once} at once{dash}"

    def room(self) -> int:
        """Trials that fit at once now (nodes come and go): see :func:`room`."""
        return room(self.tp_size, self.node_resource, self.max_concurrent_trials)


def _usable_nodes(node_resource: str) -> list[dict[str, float]]:
    """The resources of each alive node a trial may use."""
    import ray

    out = []
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        resources = node.get("Resources") or {}
        if node.get("Alive") and (not node_resource or resources.get(node_resource, 0) > 0):
            out.append({str(k): float(v) for k, v in resources.items()})
    return out


# Signals a batch system or a terminal sends the driver's whole process group; the driver turns
# each into an interrupt (rayspec.tune.__main__). Ray already blocks SIGINT in its processes.
GROUP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _services() -> Any:
    import ray._private.services as services

    return services


def apart_supported() -> bool:
    """Whether this Ray spawns its processes through the one class :func:`apart_from_group`
    replaces (Ray 2.x's ``ray._private.services.ConsolePopen``)."""
    return isinstance(getattr(_services(), "ConsolePopen", None), type)


@contextmanager
def apart_from_group() -> Iterator[None]:
    """While Ray starts: each process it spawns (GCS, raylet and, under the raylet, its agents)
    leads a process group of its own, and the group's signals wait until the driver's own
    handlers are back.

    Their lives stay tied to the driver: Ray's kernel fate sharing (``PR_SET_PDEATHSIG``) ends
    them when the driver dies, whichever group they are in. ``ray.init`` replaces the SIGTERM
    handler; the caller's is put back on exit, and a SIGTERM or SIGHUP that came meanwhile is
    delivered to it then (blocked, not lost). Ray's workers already lead groups of their own.
    """
    services = _services()
    base = services.ConsolePopen if apart_supported() else None
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if main else None

    class _OwnGroup(base or object):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            inner = kwargs.get("preexec_fn")

            def preexec() -> None:  # in the child, before exec: Ray's, then the mask back
                if inner is not None:
                    inner()
                signal.pthread_sigmask(signal.SIG_UNBLOCK, GROUP_SIGNALS)

            kwargs["preexec_fn"] = preexec
            kwargs.setdefault("process_group", 0)
            super().__init__(*args, **kwargs)

    mask = signal.pthread_sigmask(signal.SIG_BLOCK, GROUP_SIGNALS)
    if base is not None:
        services.ConsolePopen = _OwnGroup
    try:
        yield
    finally:
        if base is not None:
            services.ConsolePopen = base
        if main and handler is not None:
            signal.signal(signal.SIGTERM, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a pending signal is handled now


def room(tp_size: int, node_resource: str = "", max_concurrent_trials: int = 0) -> int:
    """Trials that fit on the cluster at once: over the alive nodes (those declaring
    ``node_resource`` when it is set), the sum of each node's ``GPUs // tp_size`` (a trial's
    GPUs are on one node, so two 4-GPU halves of different nodes hold no TP8 trial); capped by
    ``max_concurrent_trials`` when it is above 0."""
    fit = sum(int(n.get("GPU", 0.0) // tp_size) for n in _usable_nodes(node_resource))
    return min(fit, max_concurrent_trials) if max_concurrent_trials > 0 else fit


def connect(cfg: ExperimentConfig) -> ClusterHandle:
    """Start or join Ray and work out how many trials fit at once.

    Raises:
        ConfigError: the cluster has fewer GPUs than one trial needs.
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cl = cfg.cluster
    import ray

    on_loopback = not cl.address and loopback_supported()
    chose_no_auth = False
    if on_loopback and is_loopback(cl.dashboard_host) and "RAY_AUTH_MODE" not in os.environ:
        # Nothing of the private cluster is reachable from another machine: no token file,
        # no warning. Otherwise Ray's own default (a token) stands; RAY_AUTH_MODE=token also
        # keeps other users of this machine out of its loopback ports.
        os.environ["RAY_AUTH_MODE"] = "disabled"
        chose_no_auth = True

    if not cl.address:
        # Ray starts its workers at niceness 15; the bench client times tokens and must not
        # queue behind the node's other work (the server itself is reset by its reaper).
        os.environ.setdefault("RAY_worker_niceness", "0")
    try:
        return _connected(cfg, chose_no_auth, on_loopback)
    except BaseException:  # an interrupt that waited for ray.init, or a refusal: no cluster left
        ray.shutdown()
        raise


def _connected(cfg: ExperimentConfig, chose_no_auth: bool, on_loopback: bool) -> ClusterHandle:
    import ray

    from rayspec.tune._ports import with_free_ports

    cfg, _ = with_free_ports(cfg)  # dashboard port 0: a free one (the CLI has chosen it already)

    cl = cfg.cluster
    tp = cfg.server.tp_size
    if cl.address:
        with apart_from_group():  # nothing is spawned: the caller's SIGTERM handler comes back
            ctx = ray.init(address=cl.address, logging_level=logging.WARNING, log_to_driver=False)
    else:
        num_gpus = cl.num_gpus
        if num_gpus is None and cfg.server.engine is Engine.twin:
            num_gpus = tp * max(1, cl.max_concurrent_trials)  # the twin's GPUs are declared
        with loopback_node() if on_loopback else nullcontext(), apart_from_group():
            ctx = ray.init(
                address="local",
                num_cpus=cl.num_cpus,
                num_gpus=num_gpus,
                # The private cluster's one node is a usable node.
                resources={cl.node_resource: 1.0} if cl.node_resource else None,
                include_dashboard=cl.include_dashboard,
                dashboard_host=cl.dashboard_host,
                # Ray binds a port it is given even with the dashboard off (its API server
                # runs headless), and logs "Failed to bind" when it is taken: none given then.
                dashboard_port=cl.dashboard_port if cl.include_dashboard else None,
                logging_level=logging.WARNING,
                log_to_driver=False,
            )
        node_ip = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        if chose_no_auth and node_ip != LOOPBACK:
            raise RayspecError(
                f"the private Ray cluster took node IP {node_ip}, not {LOOPBACK}, so it would "
                "listen beyond loopback with auth off; set RAY_AUTH_MODE=token and run again"
            )
    nodes = _usable_nodes(cl.node_resource)
    gpus = sum(n.get("GPU", 0.0) for n in nodes)
    capacity = room(tp, cl.node_resource)
    if capacity < 1:
        if cl.node_resource and not nodes:
            raise ConfigError(
                f"cluster.node_resource: no alive node declares {cl.node_resource!r}"
            )
        raise ConfigError(
            f"server.tp_size: a trial needs {plural(tp, 'GPU')} on one node and no "
            f"{'usable ' if cl.node_resource else ''}node has them ({plural(gpus, 'GPU')} in all)"
        )
    wanted = cl.max_concurrent_trials or capacity
    return ClusterHandle(
        address=cl.address or "local",
        local=not cl.address,
        gpus=gpus,
        slots=min(wanted, capacity),
        dashboard_url=str(getattr(ctx, "dashboard_url", "") or ""),
        tp_size=tp,
        node_resource=cl.node_resource,
        max_concurrent_trials=cl.max_concurrent_trials,
        nodes=len(nodes),
    )


def disconnect(handle: ClusterHandle) -> None:
    import ray

    del handle
    if ray.is_initialized():
        ray.shutdown()
