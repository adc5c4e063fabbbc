"""The NCCL screen as Ray work: the microbenchmark runs on a node, holding the trial's GPUs.

:class:`RayNcclScreen` places one actor that holds ``num_gpus=world_size`` (so on one node,
where the servers will run, and no trial can run there meanwhile) and runs
:class:`~rayspec.screen.TorchNcclScreen` inside it. Ray's ``CUDA_VISIBLE_DEVICES`` reaches the
worker, so rank ``r`` uses the actor's ``r``-th GPU. Ray is imported only when the screen is
first used: importing :mod:`rayspec.screen` stays light (the worker module is run under other
interpreters).

On a cluster of several nodes, one node answers for all: the screen assumes the nodes alike.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from rayspec._exceptions import ActorLost
from rayspec._exceptions import CallTimeout
from rayspec._exceptions import FailureReason
from rayspec._exceptions import LaunchError
from rayspec._exceptions import RayspecError
from rayspec._plural import plural
from rayspec.screen._base import BaseNcclScreen
from rayspec.screen._base import ScreenResult
from rayspec.screen._torch import TorchNcclScreen

__all__ = ["RayNcclScreen"]

# Beyond the sets' own timeouts: each set's kill.
_PER_SET_SLACK_S = 15.0


class _NcclScreenActor:
    """The actor's body: a :class:`TorchNcclScreen` over the node's environment."""

    def __init__(self, world_size: int, options: dict[str, Any]) -> None:
        from rayspec.server._actor import node_environment

        # The node's environment as a server would see it (Ray's worker-only additions such
        # as OMP_NUM_THREADS=1 removed, Ray's CUDA_VISIBLE_DEVICES kept).
        self._screen = TorchNcclScreen(world_size, base_env=node_environment(), **options)

    def measure(
        self, envs: list[dict[str, str]], sizes_bytes: list[int], timeout_s: float
    ) -> list[ScreenResult]:
        return self._screen.measure(envs, sizes_bytes, timeout_s=timeout_s)

    def describe(self) -> str:
        return self._screen.describe()


class RayNcclScreen(BaseNcclScreen):
    """:class:`~rayspec.screen.TorchNcclScreen` in a Ray actor holding ``world_size`` GPUs.

    Call it after Ray is connected. The actor is placed on the first :meth:`measure` and
    released by :meth:`close` (ranks die with it: the worker ends itself when its owner dies).

    Args:
        world_size: ranks, and the GPUs the actor holds (``server.tp_size``).
        python: the interpreter that runs the worker on the node (``server.python``).
        backend: ``nccl`` (``gloo`` for tests on a CPU).
        device: ``cuda`` or ``cpu``.
        iters: timed all-reduces per size.
        warmup: untimed all-reduces per size.
        node_resource: a Ray custom resource the node must declare (``cluster.node_resource``).
        place_timeout_s: how long the actor may wait for its GPUs, on top of the sets' own
            timeouts (``cluster.placement_timeout_s``); 0: for ever.

    Example::

        screen = RayNcclScreen(world_size=8, python="/opt/sglang/bin/python")
        try:
            results = screen.measure([{}, {"NCCL_PROTO": "LL"}], [14336], timeout_s=120)
        finally:
            screen.close()
    """

    def __init__(
        self,
        world_size: int,
        *,
        python: str = sys.executable,
        backend: str = "nccl",
        device: str = "cuda",
        iters: int = 50,
        warmup: int = 10,
        node_resource: str = "",
        place_timeout_s: float = 600.0,
    ) -> None:
        self.world_size = world_size
        self.place_timeout_s = place_timeout_s
        self.node_resource = node_resource  # a custom resource the node must declare
        self.python = python
        self._options: dict[str, Any] = {
            "python": python,
            "backend": backend,
            "device": device,
            "iters": iters,
            "warmup": warmup,
        }
        # Validated here, in the driver, by the rules the actor applies.
        self._description = TorchNcclScreen(world_size, **self._options).describe()
        self._actor: Any = None

    def measure(
        self,
        envs: Sequence[Mapping[str, str]],
        sizes_bytes: Sequence[int],
        *,
        timeout_s: float,
    ) -> list[ScreenResult]:
        """See :meth:`BaseNcclScreen.measure`.

        Raises:
            LaunchError: the actor could not be placed or died, or the worker cannot run on
                the node (no set is to blame).
        """
        import ray

        from rayspec._rayerrors import map_ray_errors

        actor = self._start()
        ref = actor.measure.remote([dict(e) for e in envs], [int(s) for s in sizes_bytes],
                                   float(timeout_s))  # fmt: skip
        wait_s: float | None = None  # placement without a limit: the sets have their own
        if self.place_timeout_s > 0:
            wait_s = self.place_timeout_s + len(envs) * (timeout_s + _PER_SET_SLACK_S)
        try:
            with map_ray_errors():
                results: list[ScreenResult] = ray.get(ref, timeout=wait_s)
                self._description = str(ray.get(actor.describe.remote(), timeout=60))
        except CallTimeout as exc:
            self.close()
            raise LaunchError(
                f"the NCCL screen's actor gave no answer within {wait_s or 0:g} s (are "
                f"{plural(self.world_size, 'GPU')} free on one node?)",
                reason=FailureReason.UNKNOWN,
            ) from exc
        except ActorLost as exc:
            self._actor = None
            first = str(exc.__cause__ or exc).strip().splitlines()  # Ray's text: many lines
            raise LaunchError(
                f"the NCCL screen's actor died (its node lost?): {first[0] if first else exc}",
                reason=FailureReason.UNKNOWN,
            ) from exc
        except RayspecError:
            # The worker's own LaunchError (e.g. no GPU on the node), unwrapped: its one-line
            # message, not Ray's wrapping (the remote traceback, in colour); or a failed call.
            self.close()
            raise
        return results

    def describe(self) -> str:
        return self._description

    def close(self) -> None:
        """Kill the actor (Ray frees its GPUs moments later; its ranks end with it); idempotent."""
        if self._actor is None:
            return
        import ray

        actor, self._actor = self._actor, None
        ray.kill(actor)

    def _start(self) -> Any:
        if self._actor is None:
            import ray

            resources = {self.node_resource: 0.001} if self.node_resource else None
            cls = ray.remote(num_cpus=0, num_gpus=self.world_size)(_NcclScreenActor)
            self._actor = cls.options(resources=resources).remote(self.world_size, self._options)
        return self._actor
