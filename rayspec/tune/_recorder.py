"""Recording a finished trial, in the order resume relies on.

The comparison columns, the correctness gate and the acceptance alarm first; then the journal
keeps what a lost row needs, the Parquet row is written, and only then is Optuna told (a driver
killed in between leaves a RUNNING trial the next one tells from its row:
:mod:`rayspec.tune._recovery`). Then what the study knows is brought up to date: the
observations the strategy reads, the ledger pruning reads, the budget, the pick line.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from collections.abc import Sequence

from rayspec._config import ExperimentConfig
from rayspec._types import TrialRecord
from rayspec._types import TrialResult
from rayspec._types import TrialState
from rayspec.bench import per_run_goodput
from rayspec.bench import per_run_tok_s
from rayspec.results import observations_from_records
from rayspec.search import Equivalence
from rayspec.search import Observation
from rayspec.search import StudyHandle
from rayspec.search import TrialHandle
from rayspec.search._study import ATTR_AWAITS
from rayspec.store import ParquetTrialStore
from rayspec.tune._budget import Budget
from rayspec.tune._checks import Chain
from rayspec.tune._checks import OutputGate
from rayspec.tune._checks import acceptance_alarm
from rayspec.tune._decide import Measured
from rayspec.tune._gate import check_output
from rayspec.tune._ledger import Ledger
from rayspec.tune._metrics import StudyMetrics
from rayspec.tune._pick import pick_line
from rayspec.tune._progress import TrialLines
from rayspec.tune._runs import RunJudge
from rayspec.tune._trial import objective_scenario

__all__ = ["Recorder", "trial_row"]


def trial_row(
    trial: TrialHandle, result: TrialResult, runs: Sequence[float], restart: int, alarm: str
) -> TrialRecord:
    """The trial's row: the result and what the study knows of it."""
    attrs = trial.attrs
    reused = attrs.get("reused_from")
    return TrialRecord(
        result=result, params=dict(trial.params), run_values=tuple(runs),
        candidate_key=str(attrs.get("candidate_key", "")),
        note=f"reused the measurement of trial {reused}" if reused is not None else "",
        role=trial.role, reason=trial.reason, repeat_of=trial.repeat_of,
        restart=restart if result.launch is not None else None, alarm=alarm,
    )  # fmt: skip


def _chains(observations: Sequence[Observation]) -> list[Chain]:
    """The measured chain trials (topk 1), for the acceptance alarm."""
    out = []
    for o in observations:
        spec = o.candidate.spec
        if o.measured and spec is not None and spec.eagle_topk == 1 and o.runs:
            out.append(Chain(o.trial, spec.num_steps, o.accept_length, sum(o.runs) / len(o.runs)))
    return out


@dataclasses.dataclass
class Recorder:
    """Records each finished trial (call it with the trial, its result and the trial whose
    result it reuses); counts what this invocation ran, pruned and saved."""

    cfg: ExperimentConfig
    handle: StudyHandle
    store: ParquetTrialStore
    gate: OutputGate
    ledger: Ledger
    budget: Budget
    judge: RunJudge
    lines: TrialLines
    metrics: StudyMetrics  # Ray's metrics
    printer: Callable[[str], None]
    observations: list[Observation]  # every trial, this invocation's appended as recorded
    kept: list[TrialRecord]  # every row, this invocation's appended as they are written
    equivalent: Equivalence | None
    ran: int = 0
    pruned: int = 0
    saved_s: float = 0.0  # benchmark time the pruned trials saved

    def __post_init__(self) -> None:
        self._scenario = objective_scenario(self.cfg)

    def _runs(self, result: TrialResult) -> list[float]:
        """The objective's per-run values: goodput's when it is the objective (the structured
        search and the pick then weigh goodput), the throughput's otherwise. Pruning still
        watches a running trial's throughput against these: goodput <= throughput, so a trial
        pruned could not have won; some that could not are measured in full."""
        per_run = (
            per_run_goodput(result.requests, self.cfg.study.slo, self._scenario)
            if self.cfg.study.objective == "goodput"
            else per_run_tok_s(result.requests, self._scenario)
        )
        return [v for v in per_run.values() if math.isfinite(v)]

    def set_aside(self, trial: TrialHandle, result: TrialResult) -> None:
        """Keep a measured trial that awaits the baseline's outputs when the driver stops: its
        row and request rows written, Optuna not told (the trial stays RUNNING, marked); the
        next driver records it through :meth:`__call__` once it has the baseline's outputs,
        rather than measuring it again."""
        trial.set_attr(ATTR_AWAITS, True)
        stored = trial_row(trial, result, self._runs(result), self.budget.restarts, "")
        self.handle.keep_record(trial, stored)
        self.store.append_trial(stored)

    def __call__(self, trial: TrialHandle, result: TrialResult, reused_from: int | None) -> None:
        cfg, ledger, budget = self.cfg, self.ledger, self.budget
        runs = self._runs(result)
        if result.state in (TrialState.COMPLETE, TrialState.PRUNED) and runs:
            metrics = dict(result.metrics) | ledger.comparisons(runs)
            result = dataclasses.replace(result, metrics=metrics)
        result = check_output(self.gate, trial, result, self.printer)
        alarm = ""
        # Not for a plan's verification: its steps follow the load (0 at the objective's, maybe).
        planned = bool(result.candidate.adaptive_tiers)
        if result.state is TrialState.COMPLETE and result.launch is not None and not planned:
            alarm = acceptance_alarm(
                result.candidate, float(result.metrics.get("accept_length", math.nan)),
                _chains(self.observations), expected=cfg.study.expect_accept_length,
            )  # fmt: skip
        if result.costs_restart:  # a launch lost with its node is not: its retry counts
            budget.restarts += 1
        stored = trial_row(trial, result, runs, budget.restarts, alarm)
        self.handle.keep_record(trial, stored)  # the journal first, then the row, then tell
        self.store.append_trial(stored)
        self.handle.tell(trial, result)
        self.metrics.trial_done(result, budget.restarts)
        budget.told += 1
        self.observations.extend(observations_from_records([stored], {}))
        if result.state is TrialState.COMPLETE and runs and result.launch is not None:
            ledger.add(Measured(result.trial, result.candidate, tuple(runs)))
        if result.state is TrialState.PRUNED:
            self.pruned += 1
            self.saved_s += float(result.metrics.get("bench_s_saved", 0.0))
        self.judge.finished(result.trial)
        self.ran += 1
        # From the rows in memory: reading every row back after each trial (as the final
        # report does) grows with the study and holds up the freed slot's next launch.
        self.kept.append(stored)
        self.lines.set_pick(*pick_line(self.kept, self.handle.roles(), cfg, self.equivalent))
        self.lines.sink.trial_finished(result.trial)
        self.lines.finished(result, trial, reused_from)
        if alarm:
            self.printer(f"  acceptance alarm: {alarm}")
