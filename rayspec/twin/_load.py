"""A load served in process: the twin's own scheduler on a virtual clock.

The HTTP twin batches concurrent requests in :class:`~rayspec.twin._engine.Engine` (FCFS queue,
prefill batches, decode iterations over the running batch, ``max_running_requests``), paced by
the wall clock. :func:`serve_load` runs that same engine, iteration by iteration
(:meth:`Engine.iterate`), on a :class:`VirtualClock` whose sleep returns at once: the batch
model is the engine's, nothing here decides who runs. What this module adds is the client:
requests are sent in index order at most ``concurrency`` at once (a closed loop when every
``due_s`` is 0, Poisson arrivals when the bench gives their times), as
``rayspec.bench._runner`` sends them, and each request's tokens are timed as the bench client
times chunks (TTFT from sending, each later emission's gap spread over its tokens).

One thing is the HTTP round trip's: a request whose stream frees at the end of an iteration is
sent once the engine has scheduled its next iteration (the client reads the last chunk while
the engine goes on), so it waits for that iteration before its prefill, as it does over HTTP.

Example::

    served = serve_load(engine, clock, [LoadAsk(40, 500)] * 8, concurrency=8)
"""

from __future__ import annotations

import collections
import dataclasses
import types
from collections.abc import Generator
from collections.abc import Sequence

from rayspec.twin._engine import Engine
from rayspec.twin._engine import GenRequest

__all__ = ["LoadAsk", "LoadedRequest", "SimulatedCrash", "VirtualClock", "serve_load"]


class SimulatedCrash(RuntimeError):
    """The engine froze or died while serving the load (its scheduler crashed)."""


@dataclasses.dataclass(frozen=True)
class LoadAsk:
    """One request of a load: its sizes and when the client has it ready (seconds from the
    load's start; 0 for a closed loop, where only a free stream holds it back)."""

    prompt_tokens: int
    max_new_tokens: int
    due_s: float = 0.0
    category: str | None = None  # the prompt's: scales its acceptance as the twin server does


@dataclasses.dataclass(frozen=True)
class LoadedRequest:
    """One request as the client saw it (ms; ``sent_s`` in seconds from the load's start)."""

    sent_s: float
    completion_tokens: int
    verify_ct: int | None
    ttft_ms: float
    e2e_ms: float
    itl_ms: tuple[float, ...]
    histogram: tuple[int, ...] | None


class VirtualClock:
    """The engine's clock and sleep: a sleep pauses the engine's coroutine once (the driver
    acts there, with the iteration's schedule fixed), then the clock is at its deadline."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.wake_s = 0.0  # the deadline of the iteration paused now

    def __call__(self) -> float:
        return self.now_s

    async def sleep(self, delay: float) -> None:
        end = self.now_s + delay
        self.wake_s = end
        await _pause()
        self.now_s = end


def _due(at: float, start: float, end: float) -> bool:
    return at <= start or at < end


@types.coroutine
def _pause() -> Generator[None, None, None]:
    yield


@dataclasses.dataclass
class _Stream:
    """A request in flight, with the client's timeline of it."""

    req: GenRequest
    sent_s: float
    t0: float  # the load's start
    tokens: int = 0
    ttft_ms: float | None = None
    last_s: float = 0.0
    itl_ms: list[float] = dataclasses.field(default_factory=list)

    def advance(self, now: float) -> None:
        new = self.req.output_tokens - self.tokens
        if new <= 0:
            return
        if self.ttft_ms is None:
            self.ttft_ms = (now - self.sent_s) * 1000.0
        else:
            self.itl_ms.extend([(now - self.last_s) * 1000.0 / new] * new)
        self.tokens = self.req.output_tokens
        self.last_s = now

    def result(self, speculative: bool) -> LoadedRequest:
        return LoadedRequest(
            sent_s=self.sent_s - self.t0,
            completion_tokens=self.req.output_tokens,
            verify_ct=self.req.verify_ct if speculative else None,
            ttft_ms=self.ttft_ms or 0.0,
            e2e_ms=(self.last_s - self.sent_s) * 1000.0,
            itl_ms=tuple(self.itl_ms),
            histogram=tuple(self.req.histogram) if speculative else None,
        )


def serve_load(
    engine: Engine, clock: VirtualClock, asks: Sequence[LoadAsk], concurrency: int
) -> list[LoadedRequest]:
    """Serve ``asks`` through ``engine`` (built with ``clock`` and ``clock.sleep``, realtime),
    at most ``concurrency`` in flight; returns them in index order.

    Raises:
        SimulatedCrash: the engine froze (its scheduler died) before every request finished.
    """
    t0 = clock.now_s
    queue = collections.deque(range(len(asks)))
    free = max(1, concurrency)
    flying: dict[int, _Stream] = {}
    done: dict[int, LoadedRequest] = {}
    speculative = engine.spec is not None

    def send(start: float, end: float) -> None:
        # Everything due before ``end`` (at ``start`` included) that has a stream, sent at
        # ``start`` at the earliest.
        nonlocal free
        while queue and free > 0 and _due(t0 + asks[queue[0]].due_s, start, end):
            i = queue.popleft()
            free -= 1
            clock.now_s = max(start, t0 + asks[i].due_s)
            ask = asks[i]
            req = engine.submit(
                rid=str(i), prompt_tokens=ask.prompt_tokens,
                max_new_tokens=ask.max_new_tokens, output_ids=[], category=ask.category,
            )  # fmt: skip
            flying[i] = _Stream(req, clock.now_s, t0)
        clock.now_s = start

    while queue or flying:
        if engine.idle:
            if not queue or free == 0:
                raise SimulatedCrash("the engine is idle with requests still in flight")
            now = max(clock.now_s, t0 + asks[queue[0]].due_s)
            send(now, now)  # those due now: the idle engine wakes with them
            engine.restart_clock()
        step = engine.iterate()
        start = clock.wake_s = clock.now_s
        try:
            step.send(None)  # runs to the iteration's sleep: its batch and draws are fixed
        except StopIteration:
            pass  # no sleep: the scheduler died in it
        else:
            send(start, clock.wake_s)
            try:
                step.send(None)
            except StopIteration:
                pass
            else:
                raise SimulatedCrash("an engine iteration paused twice")
        if engine.frozen:
            raise SimulatedCrash("the simulated scheduler died")
        now = clock.now_s
        for i in list(flying):
            stream = flying[i]
            stream.advance(now)
            if stream.req.finished:
                done[i] = stream.result(speculative)
                del flying[i]
                free += 1
    return [done[i] for i in range(len(asks))]
