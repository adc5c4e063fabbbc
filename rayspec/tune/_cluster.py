"""Connecting to Ray: a private local cluster by default, or the configured address.

A bare ``ray.init()`` would silently join a cluster someone else started (stack-notes §3.4), so a
local cluster is always ``address="local"``, and resources are given only when we start it.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from dataclasses import dataclass

from rayspec._config import Engine
from rayspec._config import ExperimentConfig
from rayspec._exceptions import ConfigError
from rayspec._plural import plural

__all__ = ["ClusterHandle", "connect", "disconnect"]


@dataclass(frozen=True)
class ClusterHandle:
    address: str
    local: bool
    gpus: float
    slots: int
    dashboard_url: str

    def describe(self) -> str:
        where = "local Ray cluster" if self.local else f"Ray cluster at {self.address}"
        dash = f"; Ray dashboard: http://{self.dashboard_url}" if self.dashboard_url else ""
        at_once = plural(self.slots, "trial")
        return f"{where}: {plural(self.gpus, 'GPU')}, {at_once} at once{dash}"


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def connect(cfg: ExperimentConfig) -> ClusterHandle:
    """Start or join Ray and work out how many trials fit at once.

    Raises:
        ConfigError: the cluster has fewer GPUs than one trial needs.
    """
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cl = cfg.cluster
    if not cl.address and _is_loopback(cl.dashboard_host):
        # A loopback-only dashboard on a private cluster: no token file, no warning. Set
        # RAY_AUTH_MODE=token yourself on a shared machine (stack-notes §3.2).
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    tp = cfg.server.tp_size
    if cl.address:
        ctx = ray.init(address=cl.address, logging_level=logging.WARNING, log_to_driver=False)
    else:
        num_gpus = cl.num_gpus
        if num_gpus is None and cfg.server.engine is Engine.twin:
            num_gpus = tp * max(1, cl.max_concurrent_trials)  # the twin's GPUs are declared
        ctx = ray.init(
            address="local",
            num_cpus=cl.num_cpus,
            num_gpus=num_gpus,
            include_dashboard=cl.include_dashboard,
            dashboard_host=cl.dashboard_host,
            dashboard_port=cl.dashboard_port,
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
    gpus = float(ray.cluster_resources().get("GPU", 0.0))  # type: ignore[no-untyped-call]
    capacity = int(gpus // tp)
    if capacity < 1:
        ray.shutdown()
        raise ConfigError(f"server.tp_size: a trial needs {tp} GPUs and the cluster has {gpus:g}")
    wanted = cl.max_concurrent_trials or capacity
    return ClusterHandle(
        address=cl.address or "local",
        local=not cl.address,
        gpus=gpus,
        slots=min(wanted, capacity),
        dashboard_url=str(getattr(ctx, "dashboard_url", "") or ""),
    )


def disconnect(handle: ClusterHandle) -> None:
    import ray

    del handle
    if ray.is_initialized():
        ray.shutdown()
