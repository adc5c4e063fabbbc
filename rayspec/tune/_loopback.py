"""Keeping rayspec's private local Ray cluster on loopback.

Ray binds its listeners by the node's IP: the GCS, raylet (node and object manager) and every
core worker listen on 127.0.0.1 when the node IP is exactly ``127.0.0.1`` and on all interfaces
otherwise; the dashboard agent (gRPC, its HTTP job API, the metrics export port), the runtime
env agent, the dashboard's and the monitor's metrics ports follow the node IP too. Ray 2.60
takes the address of the default route as the node IP and turns a ``_node_ip_address`` of
127.0.0.1 back into that address; only where it runs single-node clusters (its
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` switch off, the default on macOS and Windows) does it keep
127.0.0.1. A private cluster is single-node by construction, so :func:`loopback_node` turns that
switch off while the cluster starts. docs/cluster.md, *What listens where*, says what a user
gets in each mode.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["LOOPBACK", "is_loopback", "loopback_node", "loopback_supported"]

LOOPBACK = "127.0.0.1"
# Read by Ray's constants at import (the driver's copy is patched below) and by every Ray
# process the cluster starts (they inherit the environment at spawn).
_SINGLE_NODE_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _constants() -> Any:
    import ray._private.ray_constants as ray_constants

    return ray_constants


def loopback_supported() -> bool:
    """Whether this Ray has the single-node switch :func:`loopback_node` relies on."""
    return hasattr(_constants(), "ENABLE_RAY_CLUSTER")


@contextmanager
def loopback_node() -> Iterator[None]:
    """While a private cluster starts: Ray's node IP is 127.0.0.1, so all its processes bind
    loopback. Restored after, so joining a cluster later in the same process is unchanged."""
    constants = _constants()
    saved_flag = constants.ENABLE_RAY_CLUSTER
    saved_env = os.environ.get(_SINGLE_NODE_SWITCH)
    constants.ENABLE_RAY_CLUSTER = False
    os.environ[_SINGLE_NODE_SWITCH] = "0"
    try:
        yield
    finally:
        constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(_SINGLE_NODE_SWITCH, None)
        else:
            os.environ[_SINGLE_NODE_SWITCH] = saved_env
