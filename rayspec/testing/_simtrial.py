"""A trial function backed by the twin's model, for studies of thousands of trials in seconds.

:class:`SimulatedTrials` is a drop-in ``trial_fn`` for :func:`rayspec.tune.run_study`: each trial
builds the exact launch a real trial would (argv, environment, per-trial twin seed), starts a
:class:`~rayspec.twin.SimulatedServer` from it, and measures it with the experiment's protocol
(warm-up, runs, prompts in the same order, the driver's prune / extend answers after each run:
the one loop of :func:`rayspec.bench._protocol.measure`, which a real trial runs too).
The result goes through the same builder as a real trial's. No Ray, no process, no HTTP.

It exists for the search benchmark and the search tests. Every scenario of the plan is
measured in order: at concurrency 1 request by request (the field protocol), under load
(concurrency > 1, closed loop or Poisson ``request_rate``) through the HTTP twin's own scheduler
on a virtual clock (:meth:`~rayspec.twin._simulate.SimulatedServer.serve`), so the rows carry
tok/s, TTFT and ITL per load as a real trial's do.

Example::

    run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None)
"""

from __future__ import annotations

import os
import tempfile
import time

from rayspec._config import ExperimentConfig
from rayspec._exceptions import FailureReason
from rayspec._types import Candidate
from rayspec._types import RequestRecord
from rayspec._types import TrialResult
from rayspec.bench import BenchPlan
from rayspec.bench import BenchResult
from rayspec.bench import RunReport
from rayspec.bench import request_input
from rayspec.bench import run_tok_s
from rayspec.bench._plan import Scenario
from rayspec.bench._protocol import Watch
from rayspec.bench._protocol import measure
from rayspec.bench._runner import arrival_offsets
from rayspec.server import build_launch
from rayspec.server._files import with_files
from rayspec.tune._trial import PhaseCallback
from rayspec.tune._trial import RunsCallback
from rayspec.tune._trial import bench_plan
from rayspec.tune._trial import failed_result
from rayspec.tune._trial import trial_result
from rayspec.twin import Profile
from rayspec.twin._load import SimulatedCrash
from rayspec.twin._simulate import LoadAsk
from rayspec.twin._simulate import SimulatedServer
from rayspec.twin._simulate import SimulatedStartupError
from rayspec.twin._text import count_prompt_tokens

__all__ = ["SimulatedTrials"]


class SimulatedTrials:
    """A ``trial_fn`` whose trials are simulated twin server starts (every load scenario).

    Args:
        profile: a profile to use instead of the experiment's ``server.twin.profile`` (e.g.
            one built in memory).

    Attributes:
        launches: trials that started a (simulated) server, in order.
    """

    def __init__(self, profile: Profile | None = None) -> None:
        self.profile = profile
        self.launches: list[int] = []

    def __call__(
        self,
        cfg: ExperimentConfig,
        number: int,
        candidate: Candidate,
        *,
        slot: int = 0,
        on_phase: PhaseCallback | None = None,
        on_runs: RunsCallback | None = None,
    ) -> TrialResult:
        plan = bench_plan(cfg)
        start = time.time()
        launch = build_launch(
            cfg, candidate, port=cfg.server.port + slot, log_path=os.devnull, trial=number
        )
        self.launches.append(number)
        if on_phase is not None:
            on_phase(number, "starting server (simulated)")
        try:
            with tempfile.TemporaryDirectory(prefix="rayspec-sim-") as files:
                # The node's side of a launch's files (a plan's tiers), read at the start.
                started = with_files(launch, files)
                server = SimulatedServer(started.argv[3:], dict(started.env), self.profile)
        except SimulatedStartupError as exc:
            return failed_result(
                number, candidate, exc.reason, str(exc), launch=launch,
                start=start, node="simulated",
            )  # fmt: skip

        def measure_run(scenario: Scenario, run: int, n: int) -> RunReport:
            if scenario.concurrency > 1:
                return _load_run(server, scenario, run, n, start)
            records = []
            for i in range(n):
                ask = request_input(scenario, run, i)
                r = server.generate(
                    count_prompt_tokens(ask.prompt), ask.max_tokens, ask.prompt, ask.category
                )
                records.append(
                    RequestRecord(
                        scenario=scenario.name, run=run, index=i, concurrency=1,
                        prompt_tokens=r.prompt_tokens, completion_tokens=r.completion_tokens,
                        ttft_ms=r.ttft_ms, e2e_ms=r.e2e_ms, itl_ms=r.itl_ms, start_unix_s=start,
                        spec_verify_ct=r.verify_ct, accept_length=r.accept_length,
                        output_ids=r.output_ids, accept_histogram=r.correct_drafts_histogram,
                        category=ask.category,
                    )
                )  # fmt: skip
            wall = sum(rec.e2e_ms for rec in records) / 1000.0
            return RunReport(scenario.name, run, tuple(records), wall, 0.0, run_tok_s(records))

        def run_plan(part: BenchPlan, watch: Watch | None) -> BenchResult:
            # The protocol's ``run``, in process: the same scenarios, warm-ups, runs and prompts
            # as the bench actor's, and the same stop after the objective's run that asked.
            reports: list[RunReport] = []
            values: list[float] = []
            stopped = ""
            objective = part.scenarios[0].name
            for scenario in part.scenarios:
                if part.warmup:
                    n = (
                        part.warmup
                        if scenario.concurrency == 1
                        else max(part.warmup, scenario.concurrency)
                    )
                    reports.append(measure_run(scenario, -1, n))
                for run in range(part.first_run, part.first_run + part.repeats):
                    reports.append(measure_run(scenario, run, scenario.requests_per_run))
                    if scenario.name != objective:
                        continue
                    values.append(reports[-1].tok_s)
                    if watch is not None and watch(values):
                        stopped = "callback"
                        break
                if stopped:
                    break
            records = tuple(r for rep in reports for r in rep.records)
            return BenchResult(records=records, runs=tuple(reports), stopped=stopped)

        decide = None if on_runs is None else (lambda values: on_runs(number, list(values)))
        try:
            bench, pruned = measure(plan, run_plan, max_repeats=cfg.max_repeats, decide=decide)
        except SimulatedCrash as exc:
            return failed_result(
                number, candidate, FailureReason.CRASH_MID_BENCHMARK, str(exc), launch=launch,
                start=start, node="simulated",
            )  # fmt: skip
        return trial_result(
            cfg, number, candidate, launch, bench, pruned=pruned,
            info={"engine": "twin (simulated in-process)"}, view={}, start=start,
            node="simulated",
        )  # fmt: skip


def _load_run(
    server: SimulatedServer, scenario: Scenario, run: int, n: int, start: float
) -> RunReport:
    """One run under load: the requests the bench sends (closed loop, or Poisson arrivals for
    a measured run with ``request_rate``), served by the twin's scheduler in process."""
    asks = [request_input(scenario, run, i) for i in range(n)]
    due = (
        arrival_offsets(scenario, run, n)
        if scenario.request_rate is not None and run >= 0
        else [0.0] * n
    )
    served = server.serve(
        [
            LoadAsk(count_prompt_tokens(a.prompt), a.max_tokens, d, a.category)
            for a, d in zip(asks, due, strict=True)
        ],
        scenario.concurrency,
    )
    records = tuple(
        RequestRecord(
            scenario=scenario.name, run=run, index=i, concurrency=scenario.concurrency,
            prompt_tokens=count_prompt_tokens(ask.prompt), completion_tokens=r.completion_tokens,
            ttft_ms=r.ttft_ms, e2e_ms=r.e2e_ms, itl_ms=r.itl_ms, start_unix_s=start + r.sent_s,
            spec_verify_ct=r.verify_ct,
            accept_length=r.completion_tokens / r.verify_ct if r.verify_ct else None,
            output_ids=server.output_ids(ask.prompt, r.completion_tokens),
            accept_histogram=r.histogram, category=ask.category,
        )
        for i, (ask, r) in enumerate(zip(asks, served, strict=True))
    )  # fmt: skip
    wall = max(r.sent_s + r.e2e_ms / 1000.0 for r in served) - min(r.sent_s for r in served)
    return RunReport(scenario.name, run, records, wall, 0.0, run_tok_s(records))
