"""A trial function backed by the twin's model, for studies of thousands of trials in seconds.

:class:`SimulatedTrials` is a drop-in ``trial_fn`` for :func:`rayspec.tune.run_study`: each trial
builds the exact launch a real trial would (argv, environment, per-trial twin seed), starts a
:class:`~rayspec.twin.SimulatedServer` from it, and measures it with the experiment's protocol
(warm-up, runs, prompts in the same order, the driver's prune / extend answers after each run:
the one loop of :func:`rayspec.bench._protocol.measure`, which a real trial runs too).
The result goes through the same builder as a real trial's. No Ray, no process, no HTTP.

It exists for the search benchmark and the search tests. It simulates batch 1 only (one
scenario, concurrency 1): the field protocol.

Example::

    run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None)
"""

from __future__ import annotations

import os
import time

from rayspec._config import ExperimentConfig
from rayspec._types import Candidate
from rayspec._types import RequestRecord
from rayspec._types import TrialResult
from rayspec.bench import BenchPlan
from rayspec.bench import BenchResult
from rayspec.bench import RunReport
from rayspec.bench import request_input
from rayspec.bench import run_tok_s
from rayspec.bench._protocol import Watch
from rayspec.bench._protocol import measure
from rayspec.server import build_launch
from rayspec.tune._trial import PhaseCallback
from rayspec.tune._trial import RunsCallback
from rayspec.tune._trial import bench_plan
from rayspec.tune._trial import failed_result
from rayspec.tune._trial import trial_result
from rayspec.twin import Profile
from rayspec.twin._simulate import SimulatedServer
from rayspec.twin._simulate import SimulatedStartupError
from rayspec.twin._text import count_prompt_tokens

__all__ = ["SimulatedTrials"]


class SimulatedTrials:
    """A ``trial_fn`` whose trials are simulated twin server starts (batch 1).

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
        if len(plan.scenarios) != 1 or plan.scenarios[0].concurrency != 1:
            raise ValueError("SimulatedTrials simulates one scenario at concurrency 1 only")
        start = time.time()
        launch = build_launch(
            cfg, candidate, port=cfg.server.port + slot, log_path=os.devnull, trial=number
        )
        self.launches.append(number)
        if on_phase is not None:
            on_phase(number, "starting server (simulated)")
        try:
            server = SimulatedServer(launch.argv[3:], dict(launch.env), self.profile)
        except SimulatedStartupError as exc:
            return failed_result(
                number, candidate, exc.reason, str(exc), launch=launch,
                start=start, node="simulated",
            )  # fmt: skip
        scenario = plan.scenarios[0]

        def measure_run(run: int, n: int) -> RunReport:
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
                        ttft_ms=r.ttft_ms, e2e_ms=r.e2e_ms, itl_ms=(), start_unix_s=start,
                        spec_verify_ct=r.verify_ct, accept_length=r.accept_length,
                        output_ids=r.output_ids, accept_histogram=r.correct_drafts_histogram,
                        category=ask.category,
                    )
                )  # fmt: skip
            wall = sum(rec.e2e_ms for rec in records) / 1000.0
            return RunReport(scenario.name, run, tuple(records), wall, 0.0, run_tok_s(records))

        def run_plan(part: BenchPlan, watch: Watch | None) -> BenchResult:
            # The protocol's ``run``, in process: the same warm-up, runs and prompts as the
            # bench actor's, and the same stop after the run that asked for it.
            reports = [measure_run(-1, part.warmup)] if part.warmup else []
            values: list[float] = []
            stopped = ""
            for run in range(part.first_run, part.first_run + part.repeats):
                reports.append(measure_run(run, part.scenarios[0].requests_per_run))
                values.append(reports[-1].tok_s)
                if watch is not None and watch(values):
                    stopped = "callback"
                    break
            records = tuple(r for rep in reports for r in rep.records)
            return BenchResult(records=records, runs=tuple(reports), stopped=stopped)

        decide = None if on_runs is None else (lambda values: on_runs(number, list(values)))
        bench, pruned = measure(plan, run_plan, max_repeats=cfg.max_repeats, decide=decide)
        return trial_result(
            cfg, number, candidate, launch, bench, pruned=pruned,
            info={"engine": "twin (simulated in-process)"}, view={}, start=start,
            node="simulated",
        )  # fmt: skip
