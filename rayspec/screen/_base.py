"""The NCCL screen's interface: all-reduce latency of NCCL environment sets, without the model.

On a real node a restart costs minutes; an all-reduce microbenchmark of one NCCL environment
costs seconds. The screen measures each candidate environment at the model's decode message
sizes (hidden size x tokens per step x bytes per element) so that only the best sets reach
end-to-end trials. A set that hangs or fails is a result too (``HANG`` / ``ERROR``): it is
never launched.

Implementations: :class:`~rayspec.screen.TwinNcclScreen` answers from the twin's NCCL model;
a GPU microbenchmark answers on a real node. The search only sees this interface.
"""

from __future__ import annotations

import abc
import enum
import math
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["BaseNcclScreen", "ScreenResult", "ScreenStatus", "env_key"]

Env = tuple[tuple[str, str], ...]


def env_key(env: Mapping[str, str]) -> Env:
    """A canonical, hashable form of an NCCL environment set (sorted ``(name, value)`` pairs)."""
    return tuple(sorted((str(k), str(v)) for k, v in env.items()))


class ScreenStatus(str, enum.Enum):
    """How one environment set fared."""

    OK = "ok"
    ERROR = "error"  # refused at communicator init or at the first collective
    HANG = "hang"  # no answer within the timeout


@dataclass(frozen=True)
class ScreenResult:
    """One environment set, measured.

    Attributes:
        env: the NCCL variables the set defines (canonical; variables it leaves unset absent).
        status: ok, error or hang.
        latency_us: ``(message bytes, all-reduce µs)`` per measured size, ascending by size.
        detail: the error text, for ``ERROR`` and ``HANG``.
        elapsed_s: wall time the measurement took (process group creation included).
    """

    env: Env
    status: ScreenStatus
    latency_us: tuple[tuple[int, float], ...] = ()
    detail: str = ""
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status is ScreenStatus.OK and bool(self.latency_us)

    def latency_at(self, nbytes: float) -> float:
        """The latency at ``nbytes``: measured, or interpolated log-log between sizes."""
        if not self.ok:
            return math.inf
        points = self.latency_us
        if nbytes <= points[0][0]:
            return points[0][1]
        for (s0, t0), (s1, t1) in zip(points, points[1:], strict=False):
            if nbytes <= s1:
                if s1 == s0 or t0 <= 0 or t1 <= 0:
                    return t1
                f = math.log(nbytes / s0) / math.log(s1 / s0)
                return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
        return points[-1][1] * nbytes / points[-1][0] if points[-1][0] > 0 else points[-1][1]


class BaseNcclScreen(abc.ABC):
    """Measures all-reduce latency for NCCL environment sets at given message sizes.

    Lifecycle: construct, call :meth:`measure` any number of times, then :meth:`close`. Not
    thread-safe: one caller at a time. Each set is measured in isolation (a real node starts a
    fresh process group per set, so a variable read once per process still takes effect).
    """

    @abc.abstractmethod
    def measure(
        self,
        envs: Sequence[Mapping[str, str]],
        sizes_bytes: Sequence[int],
        *,
        timeout_s: float,
    ) -> list[ScreenResult]:
        """Measure every set in ``envs`` at every size; one result per set, in order.

        Args:
            envs: the full environment of each set as a trial's server would get it (the
                candidate's NCCL variables plus the experiment's fixed ones).
            sizes_bytes: all-reduce message sizes, ascending.
            timeout_s: per set; a set that takes longer is a ``HANG`` result.

        A set that fails or hangs is a result, never an exception.
        """

    def describe(self) -> str:
        """One line for the progress output (what answers the screen)."""
        return type(self).__name__

    def close(self) -> None:  # noqa: B027 - an optional hook, as Optuna's samplers have
        """Release what the screen holds (processes, GPUs)."""
