"""Run-to-run noise of the twin (docs/twin-model.md, *Noise*).

Per server start, a common offset ``start_factor = 1 + N(0, σ_start)`` (clocks, thermals). Per
request, an acceptance multiplier ``mult = max(m_floor, N(1, σ_acc))`` (only with speculation;
it scales every a_j, which stay capped) and a time factor ``1 + N(0, σ_t)``. Durations are
multiplied by ``time_factor · start_factor``. The reference profile uses σ_acc = 0.056 rather than
0.07 because the twin also samples every cycle (*EAGLE-3*, per-cycle sampling), which adds its own
spread.

Everything comes from the ``random.Random`` passed in, so a fixed seed reproduces every draw; a
profile with ``noise: off`` (all sigmas 0) makes every factor exactly 1.

Example::

    noise = NoiseModel(profile.noise, random.Random(7), speculative=True)
    mult, time_factor = noise.draw_request()
"""

from __future__ import annotations

import random
from typing import NamedTuple

from rayspec.twin._profile import NoiseProfile

__all__ = ["NoiseModel", "RequestNoise"]


class RequestNoise(NamedTuple):
    """One request's draws: the acceptance multiplier and the duration factor."""

    mult: float
    time_factor: float


class NoiseModel:
    """Draws the noise of one server start and of each of its requests.

    Not thread-safe (it advances the shared ``rng``); use one per server start.

    Args:
        noise: the profile's noise constants.
        rng: the random source (seed it for reproducible runs).
        speculative: whether speculative decoding is on; without it ``mult`` is always 1 and
            no acceptance draw is made.
    """

    def __init__(
        self, noise: NoiseProfile, rng: random.Random, *, speculative: bool = True
    ) -> None:
        self.noise = noise
        self.rng = rng
        self.speculative = speculative
        self.start_offset = rng.gauss(0.0, noise.sigma_start) if noise.sigma_start > 0 else 0.0

    @property
    def start_factor(self) -> float:
        """The per-start duration factor ``1 + N(0, σ_start)``, fixed for this server start."""
        return 1.0 + self.start_offset

    def draw_request(self) -> RequestNoise:
        """Draw one request's acceptance multiplier and duration factor."""
        n = self.noise
        mult = 1.0
        if self.speculative and n.sigma_accept > 0:
            mult = max(n.accept_floor, self.rng.gauss(1.0, n.sigma_accept))
        time_factor = 1.0
        if n.sigma_time > 0:
            time_factor = 1.0 + self.rng.gauss(0.0, n.sigma_time)
        return RequestNoise(mult=mult, time_factor=time_factor)
