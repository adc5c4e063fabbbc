"""Slots for running trials: how many fit now, and a slot number (a port offset) for each."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Room"]


class Room:
    """How many trials fit now, and a slot number for each.

    A fixed count, or a function asked for the cluster's room now. Slot numbers are reused
    in the order they were freed (oldest first), so a port a stopped server just left gets a
    moment before another server binds it.
    """

    poll_s: float | None
    # With no trial running and no room, how long to wait for a node before giving up.
    _WAIT_FOR_NODE_S = 120.0

    def __init__(self, slots: int | Callable[[], int]) -> None:
        self._ask = slots if callable(slots) else None
        self.dynamic = self._ask is not None
        self._fixed = 0 if callable(slots) else int(slots)
        self._free: list[int] = []
        self._next = 0
        self.poll_s = 2.0 if self._ask is not None else None
        self.max_workers = max(1, self._fixed) if self._ask is None else 256
        self.none_left = "no node has room for a trial (server.tp_size GPUs on one node)"

    def now(self) -> int:
        return self._ask() if self._ask is not None else self._fixed

    def free(self, running: int) -> bool:
        return running < min(self.now(), self.max_workers)

    def take(self) -> int:
        if self._free:
            return self._free.pop(0)
        self._next += 1
        return self._next - 1

    def give_back(self, slot: int) -> None:
        self._free.append(slot)

    def wait_for_room(self) -> bool:
        """With nothing running: whether room appeared (a node joined) before the wait ends."""
        deadline = time.monotonic() + self._WAIT_FOR_NODE_S
        while self.now() < 1:
            if time.monotonic() >= deadline:
                return False
            time.sleep(1.0)
        return True
