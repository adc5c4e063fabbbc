"""``server.port: 0`` and ``cluster.dashboard_port: 0``: free ports, chosen as the driver starts.

The twin's experiment asks for them, so its quickstart works on a machine where another user
holds 30000 or 8265; a real node's experiment keeps the ports it names (a firewall, a load
balancer or a client may expect them), and a taken one stays a clear error.
"""

from __future__ import annotations

import dataclasses

from rayspec._config import ExperimentConfig
from rayspec._exceptions import ConfigError
from rayspec._exceptions import LaunchError

__all__ = ["AUTO", "with_free_ports"]

AUTO = 0  # the value that asks for a free port
# Where the search for a free port begins: SGLang's and Ray's own defaults, so a free machine
# gets the ports a user expects; a span past them is scanned before giving up.
FIRST_SERVER_PORT = 30000
FIRST_DASHBOARD_PORT = 8265
SCAN_SPAN = 2000


def _free(host: str, port: int) -> bool:
    from rayspec.server._process import check_port_free

    try:
        check_port_free(host, port)
    except LaunchError:
        return False
    return True


def free_block(host: str, first: int, size: int, *, key: str) -> int:
    """The lowest port from ``first`` at which ``size`` consecutive ports are free on ``host``.

    Raises:
        ConfigError: none within ``SCAN_SPAN`` ports (naming ``key``).
    """
    port = first
    while port + size - 1 < min(65536, first + SCAN_SPAN):
        taken = next((p for p in range(port, port + size) if not _free(host, p)), None)
        if taken is None:
            return port
        port = taken + 1
    raise ConfigError(
        f"{key}: 0 asks for a free port, and none of {first}-{first + SCAN_SPAN - 1} is free "
        f"on {host}; name one with {key}=..."
    )


def with_free_ports(cfg: ExperimentConfig) -> tuple[ExperimentConfig, list[str]]:
    """``cfg`` with each port that is 0 replaced by a free one (consecutive ports for the
    servers, one per concurrent trial; 30000 on a joined cluster, whose nodes this machine
    cannot probe), and a line for each free one that is not the default."""
    from rayspec.tune._preflight import planned_local_slots

    server, cluster = cfg.server, cfg.cluster
    notes: list[str] = []
    if server.port == AUTO and cfg.cluster.address:
        # The servers run on the cluster's nodes, whose ports this machine cannot probe: the
        # engine's default, as a real node's experiment names it.
        server = dataclasses.replace(server, port=FIRST_SERVER_PORT)
    elif server.port == AUTO:
        slots = planned_local_slots(cfg)
        port = free_block(server.host, FIRST_SERVER_PORT, slots, key="server.port")
        server = dataclasses.replace(server, port=port)
        if port != FIRST_SERVER_PORT:
            notes.append(f"server.port: {FIRST_SERVER_PORT} is in use here, so {port}")
    if cluster.dashboard_port == AUTO and cluster.include_dashboard:
        host = cluster.dashboard_host
        port = free_block(host, FIRST_DASHBOARD_PORT, 1, key="cluster.dashboard_port")
        cluster = dataclasses.replace(cluster, dashboard_port=port)
        if port != FIRST_DASHBOARD_PORT:
            notes.append(
                f"cluster.dashboard_port: {FIRST_DASHBOARD_PORT} is in use here, so {port}"
            )
    if server is cfg.server and cluster is cfg.cluster:
        return cfg, notes
    return dataclasses.replace(cfg, server=server, cluster=cluster), notes
