"""The twin's scheduler: one engine loop that batches requests and paces tokens in real time.

The loop imitates SGLang's scheduler at the level rayspec can observe:

- Requests wait in a FCFS queue; at most ``max_running_requests`` run at once (``#queue-req``
  counts the rest).
- New requests are admitted as one prefill batch lasting ``PerfModel.prefill_ms(prompt tokens
  of the batch)``; the prefill emits each request's first token. A prefill batch takes at most
  ``chunked_prefill_size`` prompt tokens: the request that does not fit is cut there and goes on
  in the next iterations, one chunk each (prefill first: the running streams wait, as in SGLang
  without ``--enable-mixed-chunk``), and its first token comes with its last chunk. Chunking off
  (-1): a batch takes ``max_prefill_tokens``, the first request whole whatever its length.
- Then decode iterations run over the whole running batch. One iteration lasts
  ``PerfModel.step_ms(B, mean ctx) x mean time_factor x start_factor`` and gives every running
  request ``sample_cycle_tokens(rng, mult)`` tokens (speculation) or one token. A batch above
  ``cuda_graph_max_bs`` (or any batch with graphs off) runs eagerly: ``step_ms(..., graph=False)``
  adds the profile's launch overhead.

**Pacing.** The schedule is kept on an absolute monotonic clock: each iteration ends at
``previous end + duration`` and the loop sleeps until that instant, then emits. If the process
falls behind (a busy machine), the late iteration emits at once and later deadlines are *not*
shifted, so the twin never runs slower than its model on average. When idle, the clock restarts at
the arrival of the next request.

**The simulated clock.** Beside the wall-clock schedule the engine keeps its own clock
(:attr:`Engine.sim_s`): the sum of the modelled durations of every prefill and decode iteration
since the start, nothing else. A request arrives on it at the end of the last finished
iteration (an idle engine does not count the idle time) and each emission is stamped with the
simulated end of its iteration (``GenRequest.sim_arrival_s``, ``sim_token_s``). At batch 1 those
stamps depend only on the seed and the order of requests, never on how busy the host is; the
HTTP side reports them (``meta_info.rayspec_twin``) so a twin study can measure without the
host's scheduling jitter.

**Noise (simple and documented).** Each request draws ``(mult, time_factor)`` from
:class:`NoiseModel` when it arrives. ``mult`` scales that request's acceptance; an iteration's
duration is scaled by the mean ``time_factor`` of the running requests (at batch 1: exactly that
request's factor) and by the per-start ``start_factor``.

**Counters** follow SGLang: per request ``spec_verify_ct`` (cycles it took part in), correct and
proposed drafts, a histogram of correct drafts per cycle; per decode-log window the accept length
and rate, throughput; lifetime accepted tokens / verify forwards for ``avg_spec_accept_length``
(reset by :meth:`Engine.flush`).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import random
import time
from collections.abc import AsyncIterator
from collections.abc import Awaitable
from collections.abc import Callable
from typing import Any
from typing import Protocol

from rayspec._exceptions import RayspecError
from rayspec._types import SpecSettings
from rayspec.twin._adaptive import AdaptiveSteps
from rayspec.twin._errors import DraftTreeError
from rayspec.twin._errors import NcclError
from rayspec.twin._log import SglangLog
from rayspec.twin._metrics import MetricsRegistry
from rayspec.twin._model import PerfModel
from rayspec.twin._noise import NoiseModel

_STEP_TIME_KEEP = 4096  # per batch size, newest kept


class EngineDead(RayspecError, RuntimeError):
    """The simulated scheduler crashed; streams end without a final chunk."""


class TokenSource(Protocol):
    """Where a request's tokens come from as the engine generates them (the HTTP side's
    :class:`~rayspec.twin._ends.Completion`): ``take(n)`` gives the next ``n`` ids or fewer,
    and whether the last of them ends the request (a stop string, a stop token, EOS)."""

    def take(self, n: int) -> tuple[list[int], bool]: ...


@dataclasses.dataclass
class GenRequest:
    """One generation request inside the engine (mutable; owned by the engine loop)."""

    rid: str
    index: int
    prompt_tokens: int
    max_new_tokens: int
    output_ids: list[int]
    mult: float
    time_factor: float
    rng: random.Random
    arrival_s: float
    output_tokens: int = 0
    verify_ct: int = 0
    correct_drafts: int = 0
    proposed_drafts: int = 0
    histogram: list[int] = dataclasses.field(default_factory=list)
    first_token_s: float | None = None
    last_token_s: float | None = None
    sim_arrival_s: float = 0.0  # on the engine's simulated clock (see the module docstring)
    sim_token_s: float | None = None  # simulated end of the iteration of its latest tokens
    finished_s: float | None = None
    prefilled: int = 0  # prompt tokens prefilled so far (a chunked prefill)
    # None: output_ids were given whole; else they grow as tokens are generated (and the
    # source may end the request before max_new_tokens).
    source: TokenSource | None = None
    finished: bool = False
    aborted: bool = False
    _event: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    _seen: int = 0

    @property
    def ctx(self) -> int:
        return self.prompt_tokens + self.output_tokens

    @property
    def output_so_far(self) -> list[int]:
        return self.output_ids[: self.output_tokens]

    def meta_spec(
        self, spec: SpecSettings | None, version: tuple[int, int, int]
    ) -> dict[str, Any]:
        """SGLang's speculative ``meta_info`` fields for this request (final chunk)."""
        if spec is None:
            return {}
        ct = self.verify_ct
        fields: dict[str, Any] = {"spec_verify_ct": ct}
        if version < (0, 5, 0):
            return fields
        fields["spec_accept_length"] = self.output_tokens / ct if ct else 0.0
        if spec.adaptive:  # N changed with the steps: the drafts actually proposed
            denom = self.proposed_drafts
        elif version >= (0, 5, 23):  # correct drafts / (cycles * (N - 1))
            denom = ct * (spec.num_draft_tokens - 1)
        else:  # 0.5.5: accepted drafts / (cycles * steps)
            denom = ct * spec.num_steps
        fields["spec_accept_rate"] = self.correct_drafts / denom if denom else 0.0
        if version < (0, 5, 12):  # the draft counters came in 0.5.12
            return fields
        # SGLang's histogram grows as needed: its length is the most drafts one verify step
        # accepted, plus one (e.g. [0, 0, 43] when every step accepted 2).
        histogram = list(self.histogram)
        while len(histogram) > 1 and histogram[-1] == 0:
            histogram.pop()
        fields["spec_num_correct_drafts"] = self.correct_drafts
        fields["spec_num_proposed_drafts"] = self.proposed_drafts
        fields["spec_correct_drafts_histogram"] = histogram
        if version < (0, 5, 21):  # aliases of the three above, gone in 0.5.21
            fields["spec_accepted_drafts"] = self.correct_drafts
            fields["spec_proposed_drafts"] = self.proposed_drafts
            fields["spec_accept_histogram"] = list(histogram)
        return fields


@dataclasses.dataclass
class _Window:
    iterations: int = 0
    tokens: int = 0
    forwards: int = 0
    correct: int = 0
    proposed: int = 0
    busy_s: float = 0.0


@dataclasses.dataclass
class EngineStats:
    """Lifetime and last-window figures (``/server_info``, ``/metrics``)."""

    spec_tokens: int = 0
    spec_forwards: int = 0
    spec_windows: int = 0  # decode-log windows completed since start or flush
    last_gen_throughput: float = 0.0
    last_accept_length: float = 0.0
    last_accept_rate: float = 0.0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    requests: int = 0
    verify_calls: int = 0


class Engine:
    """The simulated scheduler of one server start. Runs inside the server's event loop.

    Not thread-safe: every method is called from the event loop thread.

    Args:
        model: the performance model of this start.
        noise: the noise model of this start (per-request draws).
        log: where Decode/Prefill lines go.
        max_running_requests: the running-batch cap.
        version: emulated SGLang version (log shapes, accept-rate definition).
        seed: the twin seed (per-request cycle draws).
        decode_log_interval: iterations between ``Decode batch`` lines.
        max_total_tokens: KV pool size in tokens (token usage).
        cuda_graph_max_bs: largest captured decode batch (``cuda graph: True`` up to it).
        graph_enabled: whether decode runs as CUDA graphs at all.
        chunked_prefill_size: the most prompt tokens of one prefill forward; -1 (or 0): off.
        max_prefill_tokens: a prefill batch's token budget with chunking off.
        record_step_time: keep ``step_time_dict`` (``SGLANG_RECORD_STEP_TIME=1``).
        realtime: sleep until each deadline; False runs the schedule without waiting.
        metrics: Prometheus registry to update, if any.
        on_fatal: called with the exception when the scheduler "crashes" (draft tree).
        adaptive: SGLang's adaptive steps controller (``--speculative-adaptive``): each decode
            batch drafts the steps its batch-size tier holds.
        first_index: the index of the first request submitted (its noise and cycle seeds);
            the in-process simulation (``_load.py``) continues a start's numbering.
        clock, sleep: the monotonic clock and the sleep function (injectable for tests).
    """

    def __init__(
        self,
        model: PerfModel,
        noise: NoiseModel,
        log: SglangLog,
        *,
        max_running_requests: int,
        version: tuple[int, int, int],
        seed: int,
        decode_log_interval: int = 40,
        max_total_tokens: int = 131072,
        cuda_graph_max_bs: int = 512,
        graph_enabled: bool = True,
        chunked_prefill_size: int = -1,
        max_prefill_tokens: int = 16384,
        record_step_time: bool = False,
        realtime: bool = True,
        metrics: MetricsRegistry | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        adaptive: AdaptiveSteps | None = None,
        first_index: int = 0,
    ) -> None:
        self.model = model
        self.adaptive = adaptive
        self._step_models: dict[int, PerfModel] = {}
        self.spec = model.spec
        self.noise = noise
        self.log = log
        self.cap = max(1, max_running_requests)
        self.version = version
        self.seed = seed
        self.decode_log_interval = max(1, decode_log_interval)
        self.max_total_tokens = max(1, max_total_tokens)
        self.cuda_graph_max_bs = cuda_graph_max_bs
        self.graph_enabled = graph_enabled
        self.chunked_prefill_size = chunked_prefill_size if chunked_prefill_size > 0 else None
        self.max_prefill_tokens = max(1, max_prefill_tokens)
        self._chunked: GenRequest | None = None  # the request whose prefill goes on
        self.realtime = realtime
        self.metrics = metrics
        self.on_fatal = on_fatal
        self._now = clock
        self._sleep = sleep
        self.step_time_dict: dict[str, collections.deque[float]] | None = (
            {} if record_step_time else None
        )
        self.stats = EngineStats()
        # Below 1: the drafter is fed the wrong hidden-state layers (--twin-fault draft-layers).
        self.accept_scale = 1.0
        self._waiting: collections.deque[GenRequest] = collections.deque()
        self._running: list[GenRequest] = []
        self._wake = asyncio.Event()
        self._frozen = asyncio.Event()  # set: the scheduler hangs (stall/crash/fatal)
        self._dead = False
        self._window = _Window()
        self._decode_iterations = 0
        self._next_index = first_index
        self._task: asyncio.Task[None] | None = None
        self._token_limit: int | None = None
        self._token_count = 0
        self._on_token_limit: Callable[[], None] | None = None
        self._clock = self._now()
        self._sim_queued = 0.0  # simulated end of the iterations scheduled so far
        self.sim_s = 0.0  # simulated end of the last finished iteration

    # ------------------------------------------------------------------ public API

    def start(self) -> None:
        """Start the engine loop task (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="twin-engine")

    @property
    def idle(self) -> bool:
        return not self._waiting and not self._running and self._chunked is None

    @property
    def frozen(self) -> bool:
        """Whether the scheduler hangs or died (no further output)."""
        return self._frozen.is_set()

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def used_tokens(self) -> int:
        return sum(r.ctx for r in self._running)

    @property
    def waiting_prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self._waiting)

    def close(self) -> None:
        """Cancel the engine loop (server shutdown)."""
        if self._task is not None:
            self._task.cancel()

    def set_token_limit(self, limit: int, callback: Callable[[], None]) -> None:
        """After ``limit`` more generated tokens (server-wide), freeze and call ``callback``."""
        self._token_limit = limit
        self._token_count = 0
        self._on_token_limit = callback

    def freeze(self, dead: bool = False) -> None:
        """Stop producing output (a hung or crashed scheduler)."""
        self._dead = self._dead or dead
        self._frozen.set()
        if dead:
            for req in self._running + list(self._waiting):
                req._event.set()

    def submit(
        self,
        *,
        rid: str,
        prompt_tokens: int,
        max_new_tokens: int,
        output_ids: list[int] | None = None,
        category: str | None = None,
        source: TokenSource | None = None,
    ) -> GenRequest:
        """Queue a request; its tokens arrive through :meth:`updates`. ``category`` (the
        prompt's, when the client said) scales its acceptance (``drafter.category_mult``).
        Its ids are ``output_ids`` (given whole) or taken from ``source`` as they are
        generated (which may end it before ``max_new_tokens``)."""
        noise = self.noise.draw_request()
        by_category = self.model.profile.drafter.mult_for(category)
        index = self._next_index
        self._next_index += 1
        req = GenRequest(
            rid=rid,
            index=index,
            prompt_tokens=prompt_tokens,
            max_new_tokens=max(0, max_new_tokens),
            output_ids=list(output_ids or ()) if source is None else [],
            source=source,
            mult=noise.mult * self.accept_scale * by_category,
            time_factor=noise.time_factor,
            rng=random.Random(self.seed * 1_000_003 + index),
            arrival_s=self._now(),
            sim_arrival_s=self.sim_s,
            histogram=[0] * self._histogram_size(),
        )
        self._waiting.append(req)
        self.stats.requests += 1
        self.stats.prompt_tokens += prompt_tokens
        self._wake.set()
        return req

    def _histogram_size(self) -> int:
        if self.spec is None:
            return 1
        if self.adaptive is not None:
            return max(self.adaptive.candidate_steps) + 1
        return self.spec.num_draft_tokens

    def _model_for(self, batch: int) -> PerfModel:
        """The model of this decode batch: the adaptive tier's current steps, else the start's."""
        if self.adaptive is None:
            return self.model
        steps = self.adaptive.steps_for(batch)
        model = self._step_models.get(steps)
        if model is None:
            model = self._step_models[steps] = self.model.with_steps(steps)
        return model

    def abort(self, req: GenRequest) -> None:
        """Drop a request whose client went away."""
        if req.finished:
            return
        req.aborted = True
        req.finished = True
        if req in self._waiting:
            self._waiting.remove(req)
        if req in self._running:
            self._running.remove(req)
        if req is self._chunked:
            self._chunked = None

    async def updates(self, req: GenRequest) -> AsyncIterator[int]:
        """Yield the request's new-token count at each emission until it finishes.

        Raises:
            EngineDead: the scheduler crashed before the request finished.
        """
        while True:
            await req._event.wait()
            req._event.clear()
            if self._dead and not req.finished:
                raise EngineDead("scheduler died")
            new = req.output_tokens - req._seen
            req._seen = req.output_tokens
            if new > 0 or req.finished:
                yield new
            if req.finished:
                return

    def flush(self) -> bool:
        """``/flush_cache``: reset the speculative counters when idle; False when busy."""
        if not self.idle:
            return False
        self.stats.spec_tokens = 0
        self.stats.spec_forwards = 0
        self.stats.spec_windows = 0
        return True

    def avg_spec_accept_length(self) -> float | None:
        """Lifetime accept length since start/flush, once a decode-log window has completed."""
        if self.spec is None or self.stats.spec_windows == 0 or not self.stats.spec_forwards:
            return None
        return self.stats.spec_tokens / self.stats.spec_forwards

    # ------------------------------------------------------------------ the loop

    async def _sleep_until(self, deadline: float) -> None:
        if not self.realtime:
            await asyncio.sleep(0)
            return
        delay = deadline - self._now()
        if delay > 0:
            await self._sleep(delay)
        else:  # overdue: emit at once, but let the streams write this iteration's chunk
            await asyncio.sleep(0)

    async def _run(self) -> None:
        while True:
            if self._frozen.is_set():
                await asyncio.Event().wait()  # a hung or dead scheduler: no more output
            if self.idle:
                self._wake.clear()
                await self._wake.wait()
                self.restart_clock()
                continue
            await self.iterate()

    def restart_clock(self) -> None:
        """After an idle spell the schedule restarts at the arrival, never in the past."""
        self._clock = max(self._clock, self._now())

    async def iterate(self) -> None:
        """One scheduler iteration (the batch model): waiting requests with room in the running
        batch are admitted as one prefill, otherwise the whole running batch decodes."""
        if self._chunked is not None or (self._waiting and self._slots() > 0):
            await self._prefill()
        else:
            await self._decode()

    def _advance(self, duration_s: float) -> None:
        """Schedule an iteration of ``duration_s``: on the wall-clock deadline and on the
        simulated clock (which :meth:`_finished_iteration` moves once it has run)."""
        self._clock += duration_s
        self._sim_queued += duration_s

    def _finished_iteration(self) -> None:
        self.sim_s = self._sim_queued

    def _emit(self, req: GenRequest, n: int, now: float) -> int:
        """Give ``req`` ``n`` more tokens (fewer at the fault limit); returns tokens given."""
        if self._token_limit is not None:
            n = min(n, max(0, self._token_limit - self._token_count))
        if n > 0 and req.source is not None:  # the request's next ids, made now
            ids, ends = req.source.take(n)
            req.output_ids.extend(ids)
            n = len(ids)
            if ends:  # a stop condition: these are its last tokens
                req.max_new_tokens = req.output_tokens + n
        if n <= 0:
            return 0
        if self._token_limit is not None:
            self._token_count += n
        if req.first_token_s is None:
            req.first_token_s = now
            if self.metrics is not None:
                self.metrics.observe("time_to_first_token_seconds", now - req.arrival_s)
        elif self.metrics is not None and req.last_token_s is not None:
            gap = (now - req.last_token_s) / n
            for _ in range(n):
                self.metrics.observe("inter_token_latency_seconds", gap)
        req.last_token_s = now
        req.sim_token_s = self.sim_s
        req.output_tokens += n
        self.stats.generated_tokens += n
        if req.output_tokens >= req.max_new_tokens:
            self._finish(req, now)
        req._event.set()
        return n

    def _finish(self, req: GenRequest, now: float) -> None:
        req.finished = True
        req.finished_s = now
        if req in self._running:
            self._running.remove(req)
        if self.metrics is not None:
            e2e = now - req.arrival_s
            self.metrics.observe("e2e_request_latency_seconds", e2e)
            if req.output_tokens > 1 and req.first_token_s is not None:
                self.metrics.observe(
                    "request_time_per_output_token_seconds",
                    (now - req.first_token_s) / (req.output_tokens - 1),
                )

    def _check_token_limit(self) -> bool:
        if self._token_limit is not None and self._token_count >= self._token_limit:
            self.freeze()
            if self._on_token_limit is not None:
                self._on_token_limit()
            return True
        return False

    def _slots(self) -> int:
        """Room in the running batch (a request half-way through its prefill holds one)."""
        return self.cap - len(self._running) - (self._chunked is not None)

    def _take_prefill(self) -> tuple[list[GenRequest], int]:
        """The requests of the next prefill forward and its prompt tokens (SGLang's
        ``PrefillAdder``): the chunked request first, then the queue while slots and the token
        budget last; the request cut at the budget becomes the chunked one."""
        chunk = self.chunked_prefill_size
        budget = chunk if chunk is not None else self.max_prefill_tokens
        batch: list[GenRequest] = []
        tokens = 0
        going_on = self._chunked
        self._chunked = None
        if going_on is not None:
            rest = going_on.prompt_tokens - going_on.prefilled
            take = rest if chunk is None else min(rest, chunk)
            going_on.prefilled += take
            tokens += take
            batch.append(going_on)
            if going_on.prefilled < going_on.prompt_tokens:
                self._chunked = going_on
                return batch, tokens
        # Slots: the batch's new requests join the running batch only after this forward.
        admitted = len(batch)  # a chunked request finishing now holds its slot too
        while self._waiting and self._slots() - admitted > 0 and tokens < budget:
            req = self._waiting[0]
            need = max(0, req.prompt_tokens)
            if need > budget - tokens:
                if chunk is None and batch:
                    break  # chunking off: a long prompt waits for a batch of its own
                if chunk is not None:
                    self._waiting.popleft()
                    req.prefilled = budget - tokens
                    tokens = budget
                    batch.append(req)
                    self._chunked = req
                    break
            self._waiting.popleft()
            req.prefilled = need
            tokens += need
            batch.append(req)
            admitted += 1
        return batch, tokens

    async def _prefill(self) -> None:
        batch, new_tokens = self._take_prefill()
        self.log.scheduler(
            f"Prefill batch, #new-seq: {len(batch)}, #new-token: {new_tokens}, "
            f"#cached-token: 0, #token: {self.used_tokens}, "
            f"token usage: {self.used_tokens / self.max_total_tokens:.2f}, "
            f"#running-req: {len(self._running)}, #queue-req: {len(self._waiting)}"
            + (", " if self.version < (0, 5, 23) else "")
        )
        duration_s = self.model.prefill_ms(new_tokens) * self.noise.start_factor / 1000.0
        self._advance(duration_s)
        self._window.busy_s += duration_s
        await self._sleep_until(self._clock)
        self._finished_iteration()
        now = self._now()
        for req in batch:
            if req.aborted or req is self._chunked:
                continue
            self._running.append(req)
            if req.max_new_tokens == 0:
                self._finish(req, now)
                req._event.set()
                continue
            self._emit(req, 1, now)
        self._check_token_limit()

    async def _decode(self) -> None:
        running = list(self._running)
        batch = len(running)
        ctx = sum(r.ctx for r in running) / batch
        time_factor = sum(r.time_factor for r in running) / batch
        model = self._model_for(batch)
        graph = self.graph_enabled and batch <= self.cuda_graph_max_bs
        try:
            step_ms = model.step_ms(batch, ctx, graph=graph)
        except (DraftTreeError, NcclError) as exc:  # the scheduler process dies
            self.freeze(dead=True)
            if self.on_fatal is not None:
                self.on_fatal(exc)
            return
        duration_s = step_ms * time_factor * self.noise.start_factor / 1000.0
        # Draw the cycle outcomes now (the schedule is fixed before sleeping).
        draws = [model.sample_cycle_tokens(r.rng, r.mult) for r in running]
        self._advance(duration_s)
        await self._sleep_until(self._clock)
        if self._frozen.is_set():
            return
        self._finished_iteration()
        now = self._now()
        spec = self.spec
        drafted = model.spec.num_draft_tokens - 1 if model.spec is not None else 0
        correct_per_request: list[int] = []
        window = self._window
        window.iterations += 1
        window.busy_s += duration_s
        self._decode_iterations += 1
        if self.step_time_dict is not None:
            self.step_time_dict.setdefault(
                str(batch), collections.deque(maxlen=_STEP_TIME_KEEP)
            ).append(duration_s)
        for req, drawn in zip(running, draws, strict=True):
            if req.aborted or req.finished:
                continue
            n = min(drawn, req.max_new_tokens - req.output_tokens)
            given = self._emit(req, n, now)
            window.tokens += given
            if spec is not None:
                correct = max(0, given - 1)
                correct_per_request.append(correct)
                req.verify_ct += 1
                req.correct_drafts += correct
                req.proposed_drafts += drafted
                req.histogram[min(correct, len(req.histogram) - 1)] += 1
                window.forwards += 1
                window.correct += correct
                window.proposed += drafted
                self.stats.spec_tokens += given
                self.stats.spec_forwards += 1
                self.stats.verify_calls += 1
        if self.adaptive is not None:
            old = self.adaptive.steps_for(batch)
            new = self.adaptive.on_verify(correct_per_request, batch)
            if new is not None:
                self.log.scheduler(
                    f"Adaptive spec params updated: steps {old} -> {new} "
                    f"(ema_accept_len={self.adaptive.ema_for(batch):.2f})"
                )
        if self._decode_iterations % self.decode_log_interval == 0:
            self._log_window(batch)
        self._check_token_limit()

    def _log_window(self, batch: int) -> None:
        w = self._window
        throughput = w.tokens / w.busy_s if w.busy_s > 0 else 0.0
        self.stats.last_gen_throughput = throughput
        used = self.used_tokens
        graph = self.graph_enabled and batch <= self.cuda_graph_max_bs
        spec_part = ""
        if self.spec is not None and w.forwards:
            accept_len = w.tokens / w.forwards
            if self.version >= (0, 5, 23):
                accept_rate = w.correct / w.proposed if w.proposed else 0.0
            else:
                accept_rate = accept_len / (self.spec.num_steps + 1)
            self.stats.last_accept_length = accept_len
            self.stats.last_accept_rate = accept_rate
            self.stats.spec_windows += 1
            spec_part = f"accept len: {accept_len:.2f}, "
            if self.version >= (0, 5, 0):
                spec_part += f"accept rate: {accept_rate:.2f}, "
        sep = "." if self.version < (0, 5, 0) else ","
        line = (
            f"Decode batch{sep} #running-req: {len(self._running)}, #token: {used}, "
            f"token usage: {used / self.max_total_tokens:.2f}, {spec_part}"
            f"cuda graph: {graph}, gen throughput (token/s): {throughput:.2f}, "
            f"#queue-req: {len(self._waiting)}"
        )
        if self.version < (0, 5, 23):
            line += ", "
        self.log.scheduler(line, logging.INFO)
        self._window = _Window()
