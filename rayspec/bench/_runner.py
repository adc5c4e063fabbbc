"""Run a :class:`BenchPlan` against one live server: flush, warm up, measure, report each run."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import random
import time
from collections.abc import Awaitable
from collections.abc import Callable
from typing import Any
from typing import Protocol

import httpx

from rayspec._exceptions import BenchError
from rayspec._exceptions import FailureReason
from rayspec._exceptions import StreamStalled
from rayspec._tls import shared_ssl_context
from rayspec._types import RequestRecord
from rayspec.bench._client import StreamClient
from rayspec.bench._plan import BenchPlan
from rayspec.bench._plan import Scenario
from rayspec.bench._prompts import request_input
from rayspec.bench._stats import run_tok_s
from rayspec.engines.sglang import SERVER_INFO_PATHS

_logger = logging.getLogger(__name__)

_FLUSH_RETRY_S = 10.0
_FLUSH_POLL_S = 0.25


@dataclasses.dataclass(frozen=True)
class Shard:
    """This client's part of a load spread over ``count`` clients (BenchActors).

    Shard ``k`` sends the requests whose index ``i`` satisfies ``i % count == k`` at its share
    of the concurrency (the shares add up to the scenario's concurrency), and Poisson arrivals
    at ``rate / count`` (the union of independent Poisson streams is Poisson at ``rate``).
    Records keep the global index and the scenario's total concurrency, so the records of all
    shards together look like one client's.
    """

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if not (isinstance(self.count, int) and self.count >= 1 and 0 <= self.index < self.count):
            raise ValueError(
                f"Shard(index={self.index!r}, count={self.count!r}): expected 0 <= index < count"
            )

    def owns(self, i: int) -> bool:
        return i % self.count == self.index

    def share(self, concurrency: int) -> int:
        """This shard's part of ``concurrency`` (0 when there are more shards than streams)."""
        return concurrency // self.count + (1 if self.index < concurrency % self.count else 0)


class RunSync(Protocol):
    """Keeps sharded clients in step: every shard flushes, warms up and starts each run
    together. ``wait(key)`` blocks until all shards reached ``key`` and returns False when the
    group was aborted (another shard stopped) or timed out; ``abort()`` releases the others."""

    def wait(self, key: str) -> bool: ...

    def abort(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class RunReport:
    """One finished run (or warm-up, ``run == -1``) as the client saw it.

    Attributes:
        scenario, run: which run.
        records: its requests, in index order.
        wall_s: wall time of the run.
        client_cpu_s: CPU time the client process used during the run (``time.process_time``).
        tok_s: the run's output throughput (see :func:`~rayspec.bench.run_tok_s`).
        cpu_warn_fraction: the plan's threshold for :attr:`client_bound`.
    """

    scenario: str
    run: int
    records: tuple[RequestRecord, ...]
    wall_s: float
    client_cpu_s: float
    tok_s: float
    cpu_warn_fraction: float = 0.7

    @property
    def client_cpu_fraction(self) -> float:
        """Share of one core the client used (1.0 = one full core)."""
        return self.client_cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def client_bound(self) -> bool:
        """The client was busy enough that its timings may measure itself, not the server."""
        return self.client_cpu_fraction > self.cpu_warn_fraction

    @property
    def failed(self) -> int:
        return sum(1 for r in self.records if not r.ok)


@dataclasses.dataclass(frozen=True)
class BenchResult:
    """Everything :func:`run_benchmark_detailed` measured.

    Attributes:
        records: all requests, warm-up included (``run == -1``).
        runs: one report per warm-up and measured run, in order.
        stopped: why the benchmark ended before the plan's end ("" when it ran to completion):
            ``"error"`` (a request failed and ``plan.stop_on_error``), ``"callback"``, or
            ``"sync"`` (another shard of a sharded run stopped).
    """

    records: tuple[RequestRecord, ...]
    runs: tuple[RunReport, ...]
    stopped: str = ""

    @property
    def client_bound_runs(self) -> int:
        return sum(1 for r in self.runs if r.run >= 0 and r.client_bound)

    def client_metrics(self) -> dict[str, float]:
        """Float metrics about the client itself, to store beside :func:`summarize`'s.

        ``client_cpu_frac_max``: the largest share of one core the client used in a measured
        run (NaN without runs); ``client_bound_runs``: measured runs above the plan's
        ``cpu_warn_fraction``, whose timings may measure the client rather than the server.
        """
        measured = [r for r in self.runs if r.run >= 0]
        return {
            "client_cpu_frac_max": (
                max(r.client_cpu_fraction for r in measured) if measured else float("nan")
            ),
            "client_bound_runs": float(self.client_bound_runs),
        }

    def first_failure(self) -> tuple[FailureReason, str] | None:
        return first_failure(self.records)


def first_failure(
    records: tuple[RequestRecord, ...] | list[RequestRecord],
) -> tuple[FailureReason, str] | None:
    """The class and text of the first failed request, preferring crashes and stalls.

    A crash or stall explains the other failures of its run, so it is reported first.
    """
    failed = [r for r in records if not r.ok]
    if not failed:
        return None
    order = {FailureReason.CRASH_MID_BENCHMARK: 0, FailureReason.STALLED_STREAM: 1}
    worst = min(failed, key=lambda r: order.get(r.failure or FailureReason.UNKNOWN, 2))
    return worst.failure or FailureReason.UNKNOWN, worst.error or ""


def raise_for_failure(records: tuple[RequestRecord, ...] | list[RequestRecord]) -> None:
    """Raise the typed error of the first failure (see :func:`first_failure`), if any.

    Raises:
        StreamStalled: a stream stalled or passed its deadline.
        BenchError: any other failure; ``reason`` says which (``CRASH_MID_BENCHMARK`` for a
            lost connection).
    """
    failure = first_failure(records)
    if failure is None:
        return
    reason, text = failure
    if reason is FailureReason.STALLED_STREAM:
        raise StreamStalled(text)
    raise BenchError(text, reason=reason)


async def flush_cache(http: httpx.AsyncClient, *, retry_s: float = _FLUSH_RETRY_S) -> bool:
    """POST ``/flush_cache``, retrying while the server answers 400 (busy).

    Returns:
        True when flushed; False when the server has no such endpoint (404/405).

    Raises:
        BenchError: the server stayed busy for ``retry_s`` or cannot be reached
            (``reason=CRASH_MID_BENCHMARK``).
    """
    deadline = time.monotonic() + retry_s
    while True:
        try:
            resp = await http.post("/flush_cache")
        except httpx.TransportError as exc:
            raise BenchError(
                f"POST /flush_cache failed ({type(exc).__name__}: {exc}); is the server alive?",
                reason=FailureReason.CRASH_MID_BENCHMARK,
            ) from exc
        if resp.status_code == 200:
            return True
        if resp.status_code in (404, 405):
            _logger.warning("server has no /flush_cache (HTTP %s); not flushed", resp.status_code)
            return False
        if resp.status_code != 400 or time.monotonic() > deadline:
            raise BenchError(
                f"POST /flush_cache returned HTTP {resp.status_code} "
                f"({resp.text.strip()[:200]}) after retrying for {retry_s:g} s"
            )
        await asyncio.sleep(_FLUSH_POLL_S)


def arrival_offsets(scenario: Scenario, run: int, n: int, shard: Shard = Shard()) -> list[float]:
    """When this shard sends its ``n`` requests of a Poisson run, in seconds from the run's
    start (the first at once); the in-process simulation sends at the same offsets."""
    assert scenario.request_rate is not None
    rate = scenario.request_rate / shard.count
    rng = random.Random(
        f"{scenario.name}/{scenario.seed}/{run}/arrivals/{shard.index}/{shard.count}"
    )
    offsets, due = [], 0.0
    for _ in range(n):
        offsets.append(due)
        due += rng.expovariate(rate)
    return offsets


def run_bound_s(plan: BenchPlan, scenario: Scenario, offsets: list[float], streams: int) -> float:
    """The most wall time one run may take: its last arrival, then its requests one after
    another on each of its ``streams`` streams, each within ``plan.request_timeout_s`` (a
    closed loop's arrivals are all at once). Every request has its own deadline, so the bound
    holds unless a wait escapes them; it is the run's guarantee, not an estimate."""
    n = len(offsets)
    waves = -(-n // max(1, streams))  # ceil: the requests one stream may have to carry
    return (offsets[-1] if offsets else 0.0) + waves * plan.request_timeout_s + _RUN_SLACK_S


# Past the requests' own deadlines: the flush-free bookkeeping of a run.
_RUN_SLACK_S = 5.0


def _past_bound(
    scenario: Scenario, run: int, i: int, bound_s: float, category: str
) -> RequestRecord:
    """A request the run's bound cut off (never sent, or not finished)."""
    return RequestRecord(
        scenario=scenario.name, run=run, index=i, concurrency=scenario.concurrency,
        prompt_tokens=0, completion_tokens=0, ttft_ms=math.nan, e2e_ms=math.nan, itl_ms=(),
        start_unix_s=time.time(), category=category, failure=FailureReason.STALLED_STREAM,
        error=f"the run passed its bound of {bound_s:.0f} s (its arrivals, then "
        "bench.request_timeout_s per request on each stream) before this request ended",
    )  # fmt: skip


async def _one_run(
    client: StreamClient,
    plan: BenchPlan,
    scenario: Scenario,
    run: int,
    n: int,
    shard: Shard = Shard(),
) -> RunReport:
    mine = [i for i in range(n) if shard.owns(i)]
    inputs = {i: request_input(scenario, run, i) for i in mine}
    records: dict[int, RequestRecord] = {}
    concurrency = scenario.concurrency
    streams = shard.share(concurrency)
    paced = scenario.request_rate is not None and run >= 0  # Poisson arrivals (warm-up: not)

    async def send(i: int) -> None:
        records[i] = await client.measure(
            inputs[i].prompt,
            inputs[i].max_tokens,
            scenario=scenario.name,
            run=run,
            index=i,
            concurrency=concurrency,
            category=inputs[i].category,
            paced=paced,
        )

    offsets = arrival_offsets(scenario, run, len(mine), shard) if paced else [0.0] * len(mine)
    bound_s = run_bound_s(plan, scenario, offsets, streams)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    try:
        async with asyncio.timeout(bound_s):  # every scenario's run ends, whatever it waits on
            await _send_all(send, mine, offsets, streams, paced)
    except TimeoutError:
        for i in mine:
            if i not in records:
                records[i] = _past_bound(scenario, run, i, bound_s, inputs[i].category)
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    done = tuple(records[i] for i in sorted(records))
    report = RunReport(
        scenario=scenario.name,
        run=run,
        records=done,
        wall_s=wall,
        client_cpu_s=cpu,
        tok_s=run_tok_s(done),
        cpu_warn_fraction=plan.cpu_warn_fraction,
    )
    if run >= 0 and report.client_bound:
        _logger.warning(
            "scenario %s run %d: the client used %.0f %% of a core; its timings may measure "
            "the client rather than the server (spread the load over more BenchActors)",
            scenario.name,
            run,
            100 * report.client_cpu_fraction,
        )
    return report


async def _send_all(
    send: Callable[[int], Awaitable[None]],
    mine: list[int],
    offsets: list[float],
    streams: int,
    paced: bool,
) -> None:
    """Send requests ``mine``: a closed loop on ``streams`` streams, or (``paced``) each at its
    arrival offset, at most ``streams`` in flight."""
    if not mine or streams == 0:
        return
    if not paced:
        pending = iter(mine)

        async def worker() -> None:
            for i in pending:  # a shared iterator: each index is taken exactly once
                await send(i)

        await asyncio.gather(*(worker() for _ in range(min(streams, len(mine)))))
        return
    gate = asyncio.Semaphore(streams)

    async def gated(i: int) -> None:
        async with gate:
            await send(i)

    tasks = []
    begin = time.perf_counter()
    try:
        for i, offset in zip(mine, offsets, strict=True):
            delay = begin + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(gated(i)))
        await asyncio.gather(*tasks)
    finally:  # cut off by the run's bound: no request outlives its run
        for task in tasks:
            task.cancel()


async def arun_benchmark(
    base_url: str,
    plan: BenchPlan,
    *,
    on_run_done: Callable[[RunReport], object] | None = None,
    shard: Shard = Shard(),
    sync: RunSync | None = None,
) -> BenchResult:
    """Async form of :func:`run_benchmark_detailed`."""
    if shard.count > 1 and sync is None:
        raise ValueError("a sharded benchmark needs a RunSync to keep the shards in step")
    max_streams = max(1, max(shard.share(s.concurrency) for s in plan.scenarios))
    records: list[RequestRecord] = []
    reports: list[RunReport] = []
    stopped = ""

    def in_step(key: str) -> bool:
        return sync is None or sync.wait(key)

    async with StreamClient(
        base_url,
        max_streams=max_streams,
        endpoint=plan.endpoint,
        clock=plan.clock,
        send_category=plan.send_category,
        read_timeout_s=plan.read_timeout_s,
        request_timeout_s=plan.request_timeout_s,
        temperature=plan.temperature,
        ignore_eos=plan.ignore_eos,
        model=plan.model,
    ) as client:
        for scenario in plan.scenarios:
            if not in_step(f"{scenario.name}/flush"):
                stopped = "sync"
                break
            if plan.flush_cache and shard.index == 0:
                await flush_cache(client.http)
            measured = range(plan.first_run, plan.first_run + plan.repeats)
            runs = ([-1] if plan.warmup else []) + list(measured)
            for run in runs:
                n = scenario.requests_per_run
                if run < 0:
                    n = (
                        plan.warmup
                        if scenario.concurrency == 1
                        else max(plan.warmup, scenario.concurrency)
                    )
                if run >= 0 and plan.flush_between_runs:
                    if not in_step(f"{scenario.name}/{run}/flush"):
                        stopped = "sync"
                        break
                    if shard.index == 0:
                        await flush_cache(client.http)
                if not in_step(f"{scenario.name}/{run}"):
                    stopped = "sync"
                    break
                report = await _one_run(client, plan, scenario, run, n, shard)
                reports.append(report)
                records.extend(report.records)
                if report.failed and plan.stop_on_error:
                    stopped = "error"
                    break
                if run >= 0 and on_run_done is not None and on_run_done(report):
                    stopped = "callback"
                    break
            if stopped:
                break
    if stopped and stopped != "sync" and sync is not None:
        sync.abort()
    return BenchResult(records=tuple(records), runs=tuple(reports), stopped=stopped)


def run_benchmark_detailed(
    base_url: str,
    plan: BenchPlan,
    *,
    on_run_done: Callable[[RunReport], object] | None = None,
    shard: Shard = Shard(),
    sync: RunSync | None = None,
) -> BenchResult:
    """Run ``plan`` against the server at ``base_url``, with per-run reports.

    For each scenario: POST ``/flush_cache`` (retrying while busy), send ``plan.warmup``
    warm-up requests (``run == -1``), then ``plan.repeats`` runs of
    ``scenario.requests_per_run`` requests at ``scenario.concurrency`` (closed loop, or Poisson
    arrivals at ``scenario.request_rate`` capped at the concurrency).

    A failed request does not raise: it is a record with ``failure`` (its
    :class:`~rayspec.FailureReason`) and ``error`` set; with ``plan.stop_on_error`` the
    benchmark ends after that run. Use :func:`raise_for_failure` to turn failures into typed
    errors.

    Args:
        base_url: the server, e.g. ``"http://127.0.0.1:30000"``.
        plan: what to send.
        on_run_done: called after each measured run with its :class:`RunReport`; a truthy return
            value stops the benchmark (e.g. the trial was pruned). Its exceptions propagate.
        shard: this client's part of a load spread over several clients (see :class:`Shard`;
            :func:`~rayspec.bench.run_sharded` drives several BenchActors). Only shard 0
            flushes the cache.
        sync: required with more than one shard: the barrier that starts every shard's
            flush, warm-up and runs together (``stopped == "sync"`` when another shard
            stopped the group).

    Raises:
        BenchError: ``/flush_cache`` failed (unreachable server, or busy for 10 s).

    Example:
        >>> url = "http://127.0.0.1:30000"
        >>> result = run_benchmark_detailed(url, BenchPlan())  # doctest: +SKIP
        >>> [round(r.tok_s, 1) for r in result.runs if r.run >= 0]  # doctest: +SKIP
        [94.1, 95.3, 93.8, 96.9, 94.0]
    """
    return asyncio.run(
        arun_benchmark(base_url, plan, on_run_done=on_run_done, shard=shard, sync=sync)
    )


def run_benchmark(
    base_url: str,
    plan: BenchPlan,
    *,
    on_run_done: Callable[[RunReport], object] | None = None,
) -> list[RequestRecord]:
    """Run ``plan`` and return every request record (see :func:`run_benchmark_detailed`)."""
    return list(run_benchmark_detailed(base_url, plan, on_run_done=on_run_done).records)


def parse_metrics(text: str) -> dict[str, float]:
    """The ``sglang:`` series of a Prometheus text page, first label set of each name.

    Histogram parts (``_bucket``, ``_sum``, ``_count``) and ``_created`` series are skipped.
    """
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith("sglang:"):
            continue
        head, _, value = line.rpartition(" ")
        name = head.split("{", 1)[0].strip()
        if name in out or name.endswith(("_bucket", "_sum", "_count", "_created")):
            continue
        try:
            out[name] = float(value)
        except ValueError:
            continue
    return out


async def afetch_server_view(base_url: str, *, timeout_s: float = 10.0) -> dict[str, Any]:
    """Async form of :func:`fetch_server_view`."""
    view: dict[str, Any] = {
        "avg_spec_accept_length": None,
        "last_gen_throughput": None,
        "server_info": None,
        "metrics": {},
    }
    async with httpx.AsyncClient(
        base_url=base_url, trust_env=False, timeout=timeout_s, verify=shared_ssl_context()
    ) as http:
        try:
            for path in SERVER_INFO_PATHS:
                resp = await http.get(path)
                if resp.status_code == 200:
                    info = resp.json()
                    view["server_info"] = info
                    states = info.get("internal_states") or [{}]
                    state = states[0] if isinstance(states, list) and states else {}
                    for key in ("avg_spec_accept_length", "last_gen_throughput"):
                        value = state.get(key, info.get(key))
                        if isinstance(value, int | float) and math.isfinite(value):
                            view[key] = float(value)
                    break
            resp = await http.get("/metrics")
            if resp.status_code == 200:
                view["metrics"] = parse_metrics(resp.text)
        except httpx.TransportError as exc:
            raise BenchError(
                f"cannot read the server view from {base_url} ({type(exc).__name__}: {exc})",
                reason=FailureReason.CRASH_MID_BENCHMARK,
            ) from exc
    return view


def fetch_server_view(base_url: str, *, timeout_s: float = 10.0) -> dict[str, Any]:
    """What the server itself reports, for cross-checks against the client's measurements.

    Returns:
        ``{"avg_spec_accept_length": float | None, "last_gen_throughput": float | None,
        "server_info": dict | None, "metrics": {name: float}}`` from ``GET /server_info``
        (``internal_states[0]``; falls back to ``/get_server_info``, its name before 0.5.12)
        and ``GET /metrics`` (only served with ``--enable-metrics``; empty otherwise).
        ``avg_spec_accept_length`` is SGLang's lifetime value since the last flush, warm-up
        included (docs/sglang.md, *Measuring acceptance*).

    Raises:
        BenchError: the server cannot be reached (``reason=CRASH_MID_BENCHMARK``).
    """
    return asyncio.run(afetch_server_view(base_url, timeout_s=timeout_s))
