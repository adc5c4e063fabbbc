"""Where a trial runs, and what a cluster error means for it: its node died, its server's actor
died while the node lives, or neither.

``rayspec._rayerrors.map_ray_errors`` translates Ray's errors; a trial passes
:meth:`TrialSite.judge` to it, so an actor error becomes :class:`~rayspec.NodeLost` when the
trial's node has died (``node_lost``: retried once elsewhere), :class:`~rayspec.ActorLost` when
only the server's Ray worker has (``actor_lost``), and a plain ``unknown``
:class:`~rayspec.ClusterError` otherwise (or while the driver stops: it killed the actors).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import ray

from rayspec._exceptions import ActorLost
from rayspec._exceptions import ClusterError
from rayspec._exceptions import NodeLost
from rayspec._exceptions import RayspecError

__all__ = ["TrialSite", "alive_nodes", "lost_detail", "node_alive", "node_lost"]

# How long an unreachable actor may precede Ray marking its node dead (the GCS health check:
# 5 missed checks 3 s apart by default) before it is put down to something else. A dead actor
# on a dead node is only declared dead once the node is, so that wait is short.
_NODE_DEATH_WAIT_S = 20.0
_ACTOR_DEATH_WAIT_S = 3.0


def node_alive(node_id: str) -> bool:
    """Whether Ray counts the node alive now (an unknown node is not)."""
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        if node.get("NodeID") == node_id:
            return bool(node.get("Alive"))
    return False


def node_lost(node_id: str, err: ClusterError | None = None, wait_s: float | None = None) -> bool:
    """Whether the trial's node died: asked after one of its actors failed.

    An actor error can reach the driver before Ray marks the node dead, so after one (an
    :class:`ActorLost`) the node gets up to ``wait_s`` to be marked (by default: long for an
    unreachable actor, short for a dead one, which Ray declares dead only after its node);
    after any other error (or none) only its state now counts.
    """
    if not node_id:
        return False
    if not isinstance(err, ActorLost):
        return not node_alive(node_id)
    deadline = time.monotonic() + (_death_wait_s(err) if wait_s is None else wait_s)
    while True:
        if not node_alive(node_id):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.25)


def _death_wait_s(err: ActorLost) -> float:
    return _NODE_DEATH_WAIT_S if err.unreachable else _ACTOR_DEATH_WAIT_S


def alive_nodes() -> dict[str, str]:
    """The alive nodes now: node id -> ``"<ip> <node id>"`` (as a trial row names its node)."""
    return {
        str(n["NodeID"]): f"{n.get('NodeManagerAddress', '')} {str(n['NodeID'])[:12]}"
        for n in ray.nodes()  # type: ignore[no-untyped-call]
        if n.get("Alive")
    }


def _lost_unplaced(err: ClusterError, alive_at_start: dict[str, str]) -> str:
    """After an actor error that came before the trial learnt its node: the node it was on,
    when one of the nodes alive at the trial's start has died since ("" otherwise)."""
    if not isinstance(err, ActorLost) or not alive_at_start:
        return ""
    deadline = time.monotonic() + _death_wait_s(err)
    while True:
        now = alive_nodes()
        dead = [label for nid, label in alive_at_start.items() if nid not in now]
        if dead:
            return dead[0] if len(dead) == 1 else "one of " + ", ".join(dead)
        if time.monotonic() >= deadline:
            return ""
        time.sleep(0.25)


def lost_detail(node: str, what: str) -> str:
    return (
        f"the trial's Ray node ({node}) died {what}; the configuration is tried again "
        "on another node (once)"
    )


ACTOR_LOST_DETAIL = (
    "the Ray worker process of the trial's server actor died while its node lives "
    "(killed, or out of host memory?)"
)


@dataclasses.dataclass
class TrialSite:
    """Where a trial runs, as far as it knows yet (the trial fills in its node once placed).

    Attributes:
        alive_at_start: :func:`alive_nodes` when the trial began, to name its node if that
            dies before the trial learns it.
        stopping: whether the driver is stopping (it killed the actors: nothing is judged).
        server_gone: whether the server's actor no longer answers because it died.
        node_id: the node's Ray id, once known.
        node: ``"<ip> <node id>"``, once known.
    """

    alive_at_start: dict[str, str]
    stopping: Callable[[], bool]
    server_gone: Callable[[], bool]
    node_id: str = ""
    node: str = ""

    def judge(self, err: ClusterError) -> RayspecError:
        """What a Ray error of the trial means (for ``map_ray_errors(judge=...)``)."""
        lost_on = ""
        if not self.stopping():
            if self.node_id:
                lost_on = self.node if node_lost(self.node_id, err) else ""
            else:  # while the server actor was being placed or started
                lost_on = _lost_unplaced(err, self.alive_at_start)
        if lost_on:
            return NodeLost(lost_detail(lost_on, "mid-trial"), node=lost_on)
        # The server's actor itself gone (its worker killed) while the node lives; a
        # benchmark request then fails too, so what reached here may be either's error.
        gone = isinstance(err, ActorLost) or self.server_gone()
        if gone and not self.stopping():
            return ActorLost(f"{ACTOR_LOST_DETAIL}: {err}")
        return ClusterError(str(err))
