"""Waiting for an actor's GPUs, with a limit and a line now and then.

The driver counts the room on the cluster from its nodes' GPUs, not from what is free: a job
outside the study holding them would make a trial wait for ever, with nothing said. The wait
answers for itself: a line after a few seconds and every minute after, and a
:class:`PlacementTimeout` at ``cluster.placement_timeout_s``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import ray

from rayspec._exceptions import ClusterError
from rayspec._exceptions import FailureReason
from rayspec._plural import plural

__all__ = ["PlacementTimeout", "await_placement", "waiting_for"]

_FIRST_NOTE_S = 10.0  # placement is normally at once: say something after this long
_NOTE_EVERY_S = 60.0


class PlacementTimeout(ClusterError):
    """No node gave the actor its resources in time (``waited_s`` seconds): no server started."""

    def __init__(self, waited_s: float) -> None:
        super().__init__(f"not placed within {waited_s:.0f} s", reason=FailureReason.NO_PLACEMENT)
        self.waited_s = waited_s


def waiting_for(gpus: float, node_resource: str) -> str:
    """``8 GPUs on one node with h200``: what a trial waits for."""
    kind = f" with {node_resource}" if node_resource else ""
    return f"{plural(gpus, 'GPU')} on one node{kind}"


def await_placement(ref: Any, *, what: str, timeout_s: float, note: Callable[[str], None]) -> Any:
    """The value of ``ref``, the first call on a new actor (it answers once the actor is placed).

    Args:
        ref: an ``ObjectRef`` of that call.
        what: what the actor waits for (:func:`waiting_for`), for the lines.
        timeout_s: how long to wait; 0: for ever.
        note: called with a line while it waits.

    Raises:
        PlacementTimeout: ``timeout_s`` passed first.
        ray.exceptions.RayError: the actor died (e.g. its node) or the call failed (the
            caller translates it: ``rayspec._rayerrors.map_ray_errors``).
    """
    limit = timeout_s if timeout_s > 0 else math.inf
    start = time.monotonic()
    next_note = min(_FIRST_NOTE_S, limit / 2)  # a short limit: a line half-way
    while True:
        waited = time.monotonic() - start
        if waited >= limit:
            raise PlacementTimeout(waited)
        done, _ = ray.wait([ref], timeout=max(0.0, min(next_note, limit) - waited))
        if done:
            return ray.get(ref)
        waited = time.monotonic() - start
        if waited >= next_note:
            of = f" of {limit:g} s" if math.isfinite(limit) else ""
            note(f"waiting for {what} ({waited:.0f} s{of}; held outside the study?)")
            next_note += _NOTE_EVERY_S
