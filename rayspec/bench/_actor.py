"""The benchmark client as a Ray actor, to be placed on the node of the server it measures."""

from __future__ import annotations

import os
import threading
from typing import Any

import ray

from rayspec._types import RequestRecord
from rayspec.bench._plan import BenchPlan
from rayspec.bench._runner import BenchResult
from rayspec.bench._runner import RunReport
from rayspec.bench._runner import fetch_server_view
from rayspec.bench._runner import run_benchmark_detailed


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

    def run_detailed(self, base_url: str, plan: BenchPlan) -> BenchResult:
        """Run ``plan`` against ``base_url``; see :func:`~rayspec.bench.run_benchmark_detailed`."""
        with self._lock:
            self._reports = []
        self._stop.clear()
        return run_benchmark_detailed(base_url, plan, on_run_done=self._on_run_done)

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
