"""The pick: a study's stored trials pooled per configuration, judged as the search judges them
(:func:`rayspec.search.weigh`), and :func:`rayspec.search.pick`'s choice of the one to deploy.

Reads only stored records, so the study's end, ``python -m rayspec.report`` and the benchmarks
build the same table from the same folder.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

from rayspec._config import ExperimentConfig
from rayspec._config import Sampler
from rayspec._exceptions import ConfigError
from rayspec._exceptions import FailureReason
from rayspec._exceptions import StoreError
from rayspec._types import Candidate
from rayspec._types import TrialRecord
from rayspec._types import TrialState
from rayspec.results._plan import PLAN_ROLE
from rayspec.results._plan import plan_candidate
from rayspec.results._table import Row
from rayspec.results._table import StudyReport
from rayspec.search import Equivalence
from rayspec.search import Observation
from rayspec.search import Pick
from rayspec.search import Point
from rayspec.search import SearchSpace
from rayspec.search import believe
from rayspec.search import decide
from rayspec.search import pick
from rayspec.search import prob_better
from rayspec.search import weigh

__all__ = [
    "believes",
    "GATE_UNCHECKED",
    "build_report",
    "candidate_reader",
    "cost_key",
    "observations_from_records",
]

# The trial metric set to 1 when the gate was on but compared none of the trial's outputs (no
# baseline reference): such a trial is never picked.
GATE_UNCHECKED = "gate_unchecked"


def believes(cfg: ExperimentConfig) -> bool:
    """Whether the study is judged by the one belief (``study.sampler: belief``)."""
    return cfg.study.sampler is Sampler.belief


def cost_key(candidate: Candidate) -> tuple[int, int]:
    """Serving cost of a configuration: draft tokens, then steps (no speculation costs 0)."""
    if candidate.spec is None:
        return (0, 0)
    return (candidate.spec.num_draft_tokens, candidate.spec.num_steps)


def _f(value: Any) -> float:
    return float(value) if value is not None else math.nan


def candidate_reader(space: SearchSpace) -> Callable[[Mapping[str, Any]], Candidate]:
    """``space.candidate`` for stored parameters: the one reader of a trial's parameters.

    A trial that never got parameters (a driver killed before it asked) is the baseline.
    """

    def candidate(params: Mapping[str, Any]) -> Candidate:
        if not params:
            return Candidate()
        plan = plan_candidate(dict(params))  # a plan's verification: not a point of the space
        if plan is not None:
            return plan
        try:
            return space.candidate(params)
        except ConfigError as exc:
            raise StoreError(f"stored parameters {dict(params)} are not of this search space: "
                             f"{exc}") from exc  # fmt: skip

    return candidate


def observations_from_records(
    records: Sequence[TrialRecord], roles: dict[int, str]
) -> list[Observation]:
    """The stored trials as the search sees them, in trial order (a plan's verification
    trials are not: they are no point of the space, and the pick is static)."""
    out = []
    for r in sorted(records, key=lambda r: r.trial):
        if r.role == PLAN_ROLE or roles.get(r.trial) == PLAN_ROLE:
            continue
        out.append(
            Observation(
                trial=r.trial,
                candidate=r.candidate,
                state=r.result.state,
                runs=r.run_values,
                failure=r.result.failure,
                role=roles.get(r.trial, r.role),
                launched=r.launched,
                accept_length=_f(r.result.metrics.get("accept_length")),
                accept_histogram=r.histogram,
                feasible=not _f(r.result.metrics.get("slo_violation")) > 0,
            )
        )
    return out


def build_report(
    records: Sequence[TrialRecord],
    roles: dict[int, str],
    *,
    start_noise: float = 0.01,
    margin: float = 0.0,
    equivalent: Equivalence | None = None,
    belief: bool = False,
) -> StudyReport:
    """Pool each configuration's starts and pick the configuration to deploy.

    Args:
        records: the stored trials (``ParquetTrialStore.load_records``).
        roles: trial number -> "baseline" / "enqueued[i]" for the configurations tried first.
        start_noise: the prior between-start noise (``study.start_noise``).
        margin: ``study.pick_margin`` (0: the best estimate, guarded by the floors).
        equivalent: the NCCL screen's classes (equivalent sets pool into one configuration).
        belief: judge by the belief search's one belief (``study.sampler: belief``): its
            means and sds in the table, its decision (:func:`rayspec.search.decide`) the pick.
    """
    every = records
    records = [r for r in records if r.role != PLAN_ROLE and roles.get(r.trial) != PLAN_ROLE]
    observations = observations_from_records(records, roles)
    evidence = weigh(observations, start_noise=start_noise, equivalent=equivalent)
    by_trial = {r.trial: r for r in records}
    scenarios = sorted(
        {k.split("__", 1)[0] for r in records for k in r.result.metrics if "__tok_s_mean" in k}
    )
    # A reused result is a row of its own with a note and no runs; it belongs to the
    # configuration (same candidate key) whose measurement it repeated.
    reused: dict[str, list[int]] = {}
    for r in records:
        if r.reused and r.result.state is TrialState.COMPLETE and r.candidate_key:
            reused.setdefault(r.candidate_key, []).append(r.trial)
    rows: dict[str, Row] = {}
    for key, point in evidence.points.items():
        trials = point.trials
        measured = [by_trial[t] for t in trials]
        runs = [v for r in measured for v in r.run_values if math.isfinite(v)]
        accepts = [_f(r.result.metrics.get("accept_length")) for r in measured]
        accepts = [a for a in accepts if math.isfinite(a)]
        role = next((roles[t] for t in trials if t in roles), "")
        rows[key] = Row(
            trials=trials,
            label=point.candidate.label(),
            candidate=point.candidate,
            role=role,
            tok_s_mean=point.estimate.mean,
            tok_s_runs=sum(runs) / len(runs) if runs else math.nan,
            tok_s_peak=max(runs) if runs else math.nan,
            accept_length=sum(accepts) / len(accepts) if accepts else math.nan,
            sd=point.estimate.sd,
            starts=point.estimate.starts,
            runs=point.estimate.runs,
            per_scenario=tuple(
                (sc, _mean([_f(r.result.metrics.get(f"{sc}__tok_s_mean")) for r in measured]))
                for sc in scenarios
            ),
            reused_by=tuple(sorted(
                {t for r in measured for t in reused.get(r.candidate_key, ())}
            )),
            feasible=point.feasible,
        )  # fmt: skip
    baseline_key = next((k for k, r in rows.items() if r.role == "baseline"), None)
    if baseline_key is not None:
        base = evidence.points[baseline_key].estimate
        rows = {
            k: dataclasses.replace(r, vs_baseline_confidence=prob_better(
                evidence.points[k].estimate, base))
            for k, r in rows.items()
        }  # fmt: skip
    # A configuration the correctness gate was on for but never compared is not deployable.
    unchecked = {
        k for k, p in evidence.points.items()
        if any(_f(by_trial[t].result.metrics.get(GATE_UNCHECKED)) == 1.0 for t in p.trials)
        and not any(math.isfinite(_f(by_trial[t].result.metrics.get("gate_compared")))
                    for t in p.trials)
        and k != baseline_key
    }  # fmt: skip
    complete = {k: p for k, p in evidence.points.items() if p.complete and k not in unchecked}
    cost = {k: cost_key(p.candidate) for k, p in complete.items()}
    if belief:
        choice = _believed(observations, complete, rows, start_noise, equivalent, margin, cost)
    else:
        choice = pick(
            complete,
            cheaper_margin=margin,
            cost=cost,
            difference=evidence.difference,
            noise=evidence.noise,
        )
    ranked = sorted(rows.values(), key=lambda r: (-r.tok_s_mean, r.trial))
    per_scenario = []
    for i, sc in enumerate(scenarios):
        ranked_sc = [r for r in ranked if math.isfinite(r.per_scenario[i][1])]
        if ranked_sc:
            per_scenario.append((sc, max(ranked_sc, key=lambda r: r.per_scenario[i][1])))
    records = every  # the counts are of every trial, a plan's verification included
    states = [r.result.state for r in records]
    saved = sum(
        _f(r.result.metrics.get("bench_s_saved"))
        for r in records
        if r.result.state is TrialState.PRUNED
    )
    failures = tuple(
        (r.trial, r.candidate.label(), str(r.result.failure or "unknown"))
        for r in sorted(records, key=lambda r: r.trial)
        if r.result.state is TrialState.FAIL
        and r.result.failure != FailureReason.INTERRUPTED.value
    )
    return StudyReport(
        rows=tuple(ranked),
        baseline=rows.get(baseline_key) if baseline_key else None,
        best=rows[choice.point.key] if choice else None,
        fastest=rows[choice.best.key] if choice else None,
        pick_note=choice.note if choice else _unchecked_note(unchecked, rows),
        failed=len(failures),
        pruned=states.count(TrialState.PRUNED),
        total=len(records),
        reused=sum(1 for r in records if r.reused),
        restarts=sum(1 for r in records if r.launched),
        best_per_scenario=tuple(per_scenario),
        bench_s_saved=0.0 if math.isnan(saved) else saved,
        failures=failures,
    )


def _believed(
    observations: Sequence[Observation],
    complete: Mapping[str, Point],
    rows: dict[str, Row],
    start_noise: float,
    equivalent: Equivalence | None,
    margin: float,
    cost: Mapping[str, tuple[int, int]],
) -> Pick | None:
    """The belief's decision over the deployable configurations; the rows take its means."""
    believed = believe(observations, start_noise=start_noise, equivalent=equivalent)
    for key, row in list(rows.items()):
        if key in believed.keys:
            rows[key] = dataclasses.replace(
                row, tok_s_mean=believed.tok_s(key), sd=believed.sd(key)
            )
    feasible = [k for k, p in complete.items() if p.feasible] or list(complete)
    floors = [k for k in feasible if complete[k].floor]
    decision = decide(believed, feasible, floors, margin=margin, cost=cost)
    if decision is None:
        return None
    return Pick(complete[decision.key], complete[decision.best], decision.note)


def _unchecked_note(unchecked: set[str], rows: Mapping[str, Row]) -> str:
    """Why nothing was picked when only unchecked configurations were measured."""
    if not unchecked:
        return ""
    trials = sorted(t for k in unchecked for t in rows[k].trials)
    return (
        f"no pick: the correctness gate compared none of the outputs of trials "
        f"{', '.join(map(str, trials))} (no baseline reference), and an unchecked configuration "
        "is never picked; restore the baseline's request file or start a new study"
    )


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan
