"""The benchmark client as a Ray actor, placed on the node of the server it measures, and
:func:`run_sharded`, which spreads one plan's load over several such actors in step."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import threading
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import ray

from rayspec._types import RequestRecord
from rayspec.bench._plan import BenchPlan
from rayspec.bench._runner import BenchResult
from rayspec.bench._runner import RunReport
from rayspec.bench._runner import Shard
from rayspec.bench._runner import fetch_server_view
from rayspec.bench._runner import run_benchmark_detailed
from rayspec.bench._stats import run_tok_s


class BenchWorker:
    """The client side of a trial; :data:`BenchActor` is this class as a Ray actor.

    Lifecycle: create one per trial (or reuse it across trials of a node: it keeps no state
    between :meth:`run` calls except the progress of the current run). :meth:`run` blocks
    until the plan is done; while it runs, :meth:`progress` and :meth:`request_stop` can be
    called from the driver (the actor runs up to 4 calls at once on threads).

    Thread safety: one :meth:`run` at a time; :meth:`progress` and :meth:`request_stop` are
    safe to call concurrently with it.
    """

    def __init__(self) -> None:
        # Ray 2.60 no longer hides GPUs from 0-GPU actors; the client must not touch them.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        self._lock = threading.Lock()
        self._reports: list[RunReport] = []
        self._stop = threading.Event()

    def _on_run_done(self, report: RunReport) -> bool:
        with self._lock:
            self._reports.append(report)
        return self._stop.is_set()

    def run_detailed(
        self,
        base_url: str,
        plan: BenchPlan,
        shard: Shard | None = None,
        sync: RaySync | None = None,
    ) -> BenchResult:
        """Run ``plan`` against ``base_url``; see :func:`~rayspec.bench.run_benchmark_detailed`."""
        with self._lock:
            self._reports = []
        self._stop.clear()
        return run_benchmark_detailed(
            base_url, plan, on_run_done=self._on_run_done, shard=shard or Shard(), sync=sync
        )

    def run(self, base_url: str, plan: BenchPlan) -> list[RequestRecord]:
        """Run ``plan`` and return every request record, warm-up included."""
        return list(self.run_detailed(base_url, plan).records)

    def progress(self) -> tuple[RunReport, ...]:
        """The measured runs finished so far by the current (or last) :meth:`run`."""
        with self._lock:
            return tuple(self._reports)

    def request_stop(self) -> None:
        """Stop the current :meth:`run` after its current measured run (e.g. pruned trial)."""
        self._stop.set()

    def server_view(self, base_url: str) -> dict[str, Any]:
        """See :func:`~rayspec.bench.fetch_server_view`."""
        return fetch_server_view(base_url)

    def environment(self) -> dict[str, str]:
        """Where the actor runs: node IP, pid and its ``CUDA_VISIBLE_DEVICES``."""
        return {
            "node_ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
            "pid": str(os.getpid()),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>"),
        }


#: ``BenchWorker`` as a Ray actor class: one CPU (a busy client saturates about one core),
#: no GPU. Pin it to the server's node with ``BenchActor.options(scheduling_strategy=
#: NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()``.
#:
#: Example::
#:
#:     actor = BenchActor.remote()
#:     records = ray.get(actor.run.remote("http://127.0.0.1:30000", BenchPlan()))
BenchActor = ray.remote(num_cpus=1, num_gpus=0, max_concurrency=4)(  # type: ignore[call-overload]
    BenchWorker
)


class _Barrier:
    """A named barrier for the shards of one sharded benchmark (an async Ray actor)."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.arrived: defaultdict[str, int] = defaultdict(int)
        self.events: dict[str, asyncio.Event] = {}
        self.aborted = False

    async def wait(self, key: str, timeout_s: float) -> bool:
        if self.aborted:
            return False
        event = self.events.setdefault(key, asyncio.Event())
        self.arrived[key] += 1
        if self.arrived[key] >= self.parties:
            event.set()
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            self.abort()
            return False
        return not self.aborted

    def abort(self) -> None:
        self.aborted = True
        for event in self.events.values():
            event.set()


_BarrierActor = ray.remote(num_cpus=0)(_Barrier)


@dataclasses.dataclass(frozen=True)
class RaySync:
    """:class:`~rayspec.bench.RunSync` over a barrier actor; picklable, so each shard's
    BenchActor gets a copy. A wait longer than ``timeout_s`` aborts the whole group."""

    barrier: Any
    timeout_s: float

    def wait(self, key: str) -> bool:
        return bool(ray.get(self.barrier.wait.remote(key, self.timeout_s)))

    def abort(self) -> None:
        ray.get(self.barrier.abort.remote())


def merge_results(results: Sequence[BenchResult], plan: BenchPlan) -> BenchResult:
    """The results of a sharded benchmark as if one client had produced them.

    Records are sorted by scenario (plan order), run and index. Each run's report holds every
    shard's records, the longest wall time and the *largest* client CPU time (the busiest
    client decides whether the run was client-bound); its tok/s is recomputed over all records.
    """
    order = {s.name: k for k, s in enumerate(plan.scenarios)}
    records = sorted(
        (r for res in results for r in res.records),
        key=lambda r: (order.get(r.scenario, len(order)), r.run, r.index),
    )
    groups: dict[tuple[str, int], list[RunReport]] = defaultdict(list)
    for res in results:
        for report in res.runs:
            groups[(report.scenario, report.run)].append(report)
    runs = []
    for (scenario, run), parts in sorted(
        groups.items(), key=lambda kv: (order.get(kv[0][0], len(order)), kv[0][1])
    ):
        recs = tuple(r for r in records if r.scenario == scenario and r.run == run)
        runs.append(
            RunReport(
                scenario=scenario,
                run=run,
                records=recs,
                wall_s=max(p.wall_s for p in parts),
                client_cpu_s=max(p.client_cpu_s for p in parts),
                tok_s=run_tok_s(recs),
                cpu_warn_fraction=plan.cpu_warn_fraction,
            )
        )
    rank = {"error": 0, "callback": 1, "sync": 2, "": 3}
    stopped = min((res.stopped for res in results), key=lambda s: rank.get(s, 0), default="")
    return BenchResult(records=tuple(records), runs=tuple(runs), stopped=stopped)


def run_sharded(
    base_url: str,
    plan: BenchPlan,
    actors: Sequence[Any],
    *,
    sync_timeout_s: float | None = None,
) -> BenchResult:
    """Run ``plan`` with its load spread over several BenchActors, in step, and merge.

    One client process handles roughly 6,000 (paced, one token per chunk) to 18,000
    (unpaced) streamed chunks per second (``benchmarks/client_fidelity.py``); above that its
    timings measure itself. Shard the load so each actor stays well below a core.

    Args:
        base_url: the server.
        plan: as for :func:`~rayspec.bench.run_benchmark_detailed`.
        actors: BenchActor handles, ideally on the server's node, each on its own CPU.
        sync_timeout_s: the longest a shard waits for the others at a barrier (default: long
            enough for the slowest run the plan allows); past it the group is aborted.

    Returns:
        The merged :class:`BenchResult` (see :func:`merge_results`).

    Example::

        actors = [BenchActor.remote() for _ in range(4)]
        result = run_sharded("http://127.0.0.1:30000", plan, actors)
    """
    if not actors:
        raise ValueError("run_sharded needs at least one BenchActor")
    if sync_timeout_s is None:
        waves = max(math.ceil(s.requests_per_run / s.concurrency) for s in plan.scenarios)
        sync_timeout_s = waves * plan.request_timeout_s + 60.0
    barrier = _BarrierActor.remote(len(actors))
    try:
        sync = RaySync(barrier, float(sync_timeout_s))
        refs = [
            actor.run_detailed.remote(base_url, plan, Shard(k, len(actors)), sync)
            for k, actor in enumerate(actors)
        ]
        return merge_results(ray.get(refs), plan)
    finally:
        ray.kill(barrier)  # type: ignore[arg-type]
