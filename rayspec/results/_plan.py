"""A per-load plan (SGLang's adaptive tiers) against the best static configuration, per load.

The plan is data (:class:`Plan`): the tiers (batch size -> candidate steps), the NCCL set and
the algorithm one server runs them with. Its verification trial is stored like any other, with
role ``plan`` and one parameter, ``plan`` (this JSON), so a study folder says which plan ran.

:func:`plan_verdict` compares, at every load of the ladder, the plan's measurement with the pick
(the best static configuration: the one ``best.sh`` launches) and the best no-speculation row,
each with its 95 % interval: its runs' spread (``tok_s_std`` over ``runs``) and one start's
offset (``study.start_noise``) per server start, pooled over the starts. The rule
(:func:`recommend`): the plan is recommended only where it is not slower than the static pick at
any load by more than the noise of the difference (1.96 sd of plan - static), by its own
verification or by the search's starts of the setting it runs at that load (a chain, or no
speculation, with its NCCL set): one lucky verification start does not outweigh several starts
that measured the plan's chain slower than the pick's tree.

Pure: reads stored records, never a file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

from rayspec._types import Candidate
from rayspec._types import SpecSettings
from rayspec._types import TrialRecord
from rayspec._types import TrialState
from rayspec.results._table import StudyReport
from rayspec.search import Equivalence

__all__ = [
    "PLAN_PARAM",
    "PLAN_ROLE",
    "Figure",
    "LoadCheck",
    "Plan",
    "PlanVerdict",
    "figure",
    "plan_candidate",
    "plan_verdict",
    "recommend",
]

PLAN_ROLE = "plan"
PLAN_PARAM = "plan"  # the stored parameter of a verification trial: the plan as JSON
Z95 = 1.96


@dataclass(frozen=True)
class Plan:
    """One server for every load: the tiers and what it runs them with.

    Attributes:
        tiers: (batch size, candidate steps), ascending batch sizes (0 steps: plain decoding).
        nccl_env: the NCCL set of the server (one server, one environment).
        algorithm: EAGLE or EAGLE3.
        start_steps: ``--speculative-num-steps`` (SGLang requires it among the tiers' steps).
        overlap: False turns the speculative overlap scheduler off, as the source chain had it.
    """

    tiers: tuple[tuple[int, tuple[int, ...]], ...]
    nccl_env: tuple[tuple[str, str], ...]
    algorithm: str
    start_steps: int
    overlap: bool = True

    def steps_at(self, batch: int) -> int:
        """The tier's first candidate step at ``batch`` (SGLang routes a batch to the largest
        tier key not above it)."""
        below = [steps for bs, steps in self.tiers if bs <= batch]
        return (below[-1] if below else self.tiers[0][1])[0]

    def candidate(self) -> Candidate:
        """The verification trial's configuration: adaptive topk-1 steps with these tiers."""
        k = self.start_steps
        spec = SpecSettings(self.algorithm, k, 1, k + 1, adaptive=True, overlap=self.overlap)
        return Candidate(nccl_env=self.nccl_env, spec=spec, adaptive_tiers=self.tiers)

    def to_json(self) -> str:
        return json.dumps(
            {
                "tiers": {str(bs): list(steps) for bs, steps in self.tiers},
                "nccl_env": [list(kv) for kv in self.nccl_env],
                "algorithm": self.algorithm,
                "start_steps": self.start_steps,
                "overlap": self.overlap,
            },
            sort_keys=True,
        )

    @staticmethod
    def from_json(text: str) -> Plan:
        raw = json.loads(text)
        return Plan(
            tiers=tuple(
                sorted(
                    (int(bs), tuple(int(s) for s in steps)) for bs, steps in raw["tiers"].items()
                )
            ),
            nccl_env=tuple((str(k), str(v)) for k, v in raw["nccl_env"]),
            algorithm=str(raw["algorithm"]),
            start_steps=int(raw["start_steps"]),
            overlap=bool(raw.get("overlap", True)),
        )


def plan_candidate(params: dict[str, object]) -> Candidate | None:
    """The candidate of a stored verification trial (None: not one)."""
    text = params.get(PLAN_PARAM)
    return Plan.from_json(str(text)).candidate() if isinstance(text, str) else None


@dataclass(frozen=True)
class Figure:
    """A throughput at one load: the mean over the starts, the 95 % half-width, the trials."""

    mean: float
    half: float
    trials: tuple[int, ...]

    @property
    def ok(self) -> bool:
        return math.isfinite(self.mean)


_NONE = Figure(math.nan, math.nan, ())


def _metric(record: TrialRecord, scenario: str | None, key: str) -> float:
    name = key if scenario is None else f"{scenario}__{key}"
    value = record.result.metrics.get(name)
    return float(value) if value is not None else math.nan


def figure(records: Sequence[TrialRecord], scenario: str | None, start_noise: float) -> Figure:
    """The pooled tok/s of ``records`` (one configuration's starts) at one scenario.

    ``scenario`` None is the objective's (stored unprefixed). Each start contributes its runs'
    variance of the mean (``tok_s_std**2 / runs``) and one start offset (``start_noise`` x its
    mean); the mean is the plain mean over the starts.
    """
    means, var = [], 0.0
    trials = []
    for r in records:
        if r.result.state is not TrialState.COMPLETE:
            continue
        m = _metric(r, scenario, "tok_s_mean")
        if not math.isfinite(m):
            continue
        sd, n = _metric(r, scenario, "tok_s_std"), _metric(r, scenario, "runs")
        within = sd * sd / n if math.isfinite(sd) and n >= 2 else (m * start_noise) ** 2
        var += within + (m * start_noise) ** 2
        means.append(m)
        trials.append(r.trial)
    if not means:
        return _NONE
    k = len(means)
    return Figure(sum(means) / k, Z95 * math.sqrt(var) / k, tuple(trials))


@dataclass(frozen=True)
class LoadCheck:
    """One load: the plan, the static pick, no speculation, and the verdict on the difference.

    Attributes:
        concurrency: the load (the scenario's concurrency).
        scenario: its name.
        steps: the plan's steps at this load.
        plan, static, off: the three figures (tok/s, 95 % half-width).
        noise: 1.96 sd of plan - static.
        searched: the plan's setting at this load (its steps as a static chain, or no
            speculation, with the plan's NCCL set) as the search measured it: more starts than
            the verification's, so a plan whose single verification start was lucky is still
            caught where its own setting is known to be slower.
        searched_noise: 1.96 sd of searched - static.
    """

    concurrency: int
    scenario: str
    steps: int
    plan: Figure
    static: Figure
    off: Figure
    noise: float
    searched: Figure = _NONE
    searched_noise: float = math.nan

    @property
    def diff(self) -> float:
        return self.plan.mean - self.static.mean

    @property
    def searched_diff(self) -> float:
        return self.searched.mean - self.static.mean

    @property
    def searched_worse(self) -> bool:
        """The plan's setting here, as the search measured it, is slower than the static pick
        by more than the noise (never when it is the static pick's own starts)."""
        if not (self.searched.ok and self.static.ok) or self.searched.trials == self.static.trials:
            return False
        return self.searched_diff < -self.searched_noise

    @property
    def worse(self) -> bool:
        """Slower than the static pick by more than the noise, by the verification or by the
        search's own starts of the plan's setting (unmeasured counts as worse)."""
        if not (self.plan.ok and self.static.ok):
            return not self.plan.ok
        return self.diff < -self.noise or self.searched_worse

    @property
    def better(self) -> bool:
        return self.plan.ok and self.static.ok and self.diff > self.noise


@dataclass(frozen=True)
class PlanVerdict:
    """The plan's verification.

    Attributes:
        plan: the plan verified (the latest one measured).
        trials: its verification trials (those that failed included).
        loads: one check per load, lowest concurrency first (empty: it never completed).
        recommended: whether to deploy the plan instead of the static pick.
        why: the reason, one line.
        cost: the cost of enabling adaptive where the plan runs the static pick's own steps
            with its NCCL set: (load, static - plan in tok/s, its noise); empty where no load
            does.
    """

    plan: Plan
    trials: tuple[int, ...]
    loads: tuple[LoadCheck, ...]
    recommended: bool
    why: str
    cost: tuple[tuple[int, float, float], ...] = ()


def recommend(loads: Sequence[LoadCheck], same_as_static: bool = False) -> tuple[bool, str]:
    """The rule: the plan only where it is not slower than the static pick at any load by more
    than the noise (and not where it runs the pick's own settings at every load: adaptive mode
    then only adds its cost); the reason in words.

    Args:
        same_as_static: the plan's steps and NCCL set are the static pick's at every load.
    """
    if not loads or not any(c.plan.ok for c in loads):
        return (
            False,
            "not recommended: the plan's verification did not complete; deploy the static pick",
        )
    worse = [c for c in loads if c.worse]
    if worse:
        where = ", ".join(_where(c) for c in worse)
        return False, (
            f"not recommended: slower than the static pick beyond the noise at {where}; "
            "deploy the static pick"
        )
    if same_as_static:
        return False, (
            "not recommended: the plan runs the static pick's own steps and NCCL set at every "
            "load, so adaptive mode only adds its cost; deploy the static pick"
        )
    better = [c for c in loads if c.better]
    if better:
        where = ", ".join(f"{c.concurrency} ({c.diff / c.static.mean:+.1%})" for c in better)
        return (
            True,
            f"recommended: never slower than the static pick, faster at concurrency {where}",
        )
    return True, (
        "recommended, for no measured gain: within the noise of the static pick at every load"
    )


def _where(c: LoadCheck) -> str:
    if not c.plan.ok:
        return f"concurrency {c.concurrency} (not measured)"
    if c.diff < -c.noise:
        return f"concurrency {c.concurrency} ({c.diff:+.1f} tok/s, noise ±{c.noise:.1f})"
    return (
        f"concurrency {c.concurrency} (its setting as the search measured it: "
        f"{c.searched_diff:+.1f} tok/s, noise ±{c.searched_noise:.1f})"
    )


def plan_verdict(
    report: StudyReport,
    records: Sequence[TrialRecord],
    loads: Sequence[tuple[str, int]],
    *,
    objective: str,
    start_noise: float,
    equivalent: Equivalence | None = None,
) -> PlanVerdict | None:
    """The verification of the latest plan measured, or None when no plan trial is stored.

    Args:
        report: the study's report (its pick is the static configuration compared with).
        records: every stored trial.
        loads: (scenario, concurrency) of each closed-loop load.
        objective: the objective's scenario (its metrics are stored unprefixed).
        start_noise: ``study.start_noise``.
        equivalent: the NCCL screen's classes: a set of the pick's class counts as the pick's
            own NCCL set for adaptive's cost.
    """
    plans = [r for r in records if r.role == PLAN_ROLE and PLAN_PARAM in r.params]
    if not plans:
        return None
    latest = max(plans, key=lambda r: r.trial)
    plan = Plan.from_json(str(latest.params[PLAN_PARAM]))
    mine = [r for r in plans if r.params[PLAN_PARAM] == latest.params[PLAN_PARAM]]
    by_trial = {r.trial: r for r in records}
    static = [by_trial[t] for t in report.best.trials] if report.best is not None else []
    checks = []
    for scenario, concurrency in sorted(loads, key=lambda sc: sc[1]):
        key = None if scenario == objective else scenario
        p = figure(mine, key, start_noise)
        s = figure(static, key, start_noise)
        offs = [
            figure([by_trial[t] for t in row.trials], key, start_noise)
            for row in report.rows
            if row.candidate.spec is None
        ]
        off = max((f for f in offs if f.ok), key=lambda f: f.mean, default=_NONE)
        half = math.sqrt(p.half**2 + s.half**2) if p.ok and s.ok else math.nan
        steps = plan.steps_at(concurrency)
        own = [
            by_trial[t]
            for row in report.rows
            if _runs_setting(row.candidate, plan, steps, equivalent)
            for t in row.trials
        ]
        q = figure(own, key, start_noise)
        q_half = math.sqrt(q.half**2 + s.half**2) if q.ok and s.ok else math.nan
        checks.append(LoadCheck(concurrency, scenario, steps, p, s, off, half, q, q_half))
    cost = _cost(plan, report, checks, equivalent)
    ok, why = recommend(checks, same_as_static=len(cost) == len(checks))
    return PlanVerdict(plan, tuple(r.trial for r in mine), tuple(checks), ok, why, cost)


def _same_nccl(
    a: tuple[tuple[str, str], ...],
    b: tuple[tuple[str, str], ...],
    equivalent: Equivalence | None,
) -> bool:
    """The same NCCL set, or (with the screen's classes) one of the same class."""
    return a == b if equivalent is None else equivalent(a) == equivalent(b)


def _runs_setting(
    candidate: Candidate, plan: Plan, steps: int, equivalent: Equivalence | None
) -> bool:
    """Whether a static row runs what the plan runs at a load of ``steps``: that chain (or no
    speculation at 0) with the plan's NCCL set (or one of its screen class)."""
    if candidate.server_settings or candidate.adaptive_tiers or candidate.flags:
        return False
    same_nccl = _same_nccl(candidate.nccl_env, plan.nccl_env, equivalent)
    spec = candidate.spec
    if spec is None:
        return same_nccl and steps == 0
    return (
        same_nccl
        and steps > 0
        and spec.eagle_topk == 1
        and not spec.adaptive
        and spec.num_steps == steps
        and spec.algorithm == plan.algorithm
        and spec.overlap == plan.overlap
    )


def _cost(
    plan: Plan,
    report: StudyReport,
    checks: Sequence[LoadCheck],
    equivalent: Equivalence | None = None,
) -> tuple[tuple[int, float, float], ...]:
    """Where the plan runs the static pick's own settings (same steps as a topk-1 chain or no
    speculation, the same NCCL set or one of its screen class), static - plan is what adaptive
    mode costs there."""
    best = report.best
    if best is None or best.candidate.server_settings or best.candidate.adaptive_tiers:
        return ()
    spec = best.candidate.spec
    if spec is not None and (spec.eagle_topk != 1 or spec.adaptive):
        return ()
    if not _same_nccl(best.candidate.nccl_env, plan.nccl_env, equivalent):
        return ()
    steps = spec.num_steps if spec is not None else 0
    return tuple(
        (c.concurrency, c.static.mean - c.plan.mean, c.noise)
        for c in checks
        if c.steps == steps and c.plan.ok and c.static.ok
    )


def _pm(f: Figure) -> str:
    return f"{f.mean:.1f} ± {f.half:.1f}" if f.ok else "—"


def verdict_rows(verdict: PlanVerdict) -> list[tuple[str, ...]]:
    """The per-load table: load, the plan's steps, plan, static pick, no speculation (tok/s
    ± 95 %), and plan - static ± its noise."""
    rows: list[tuple[str, ...]] = []
    for c in verdict.loads:
        diff = f"{c.diff:+.1f} ± {c.noise:.1f}" if c.plan.ok and c.static.ok else "—"
        mark = " (worse)" if c.worse and c.plan.ok else " (better)" if c.better else ""
        rows.append((
            f"{c.concurrency}", str(c.steps), _pm(c.plan), _pm(c.static), _pm(c.off), diff + mark,
        ))  # fmt: skip
    return rows


VERDICT_HEADER = (
    "concurrency", "plan steps", "plan tok/s", "static pick tok/s", "no speculation tok/s",
    "plan - static",
)  # fmt: skip


def cost_line(verdict: PlanVerdict) -> str:
    """What enabling adaptive cost, as measured (or why it was not)."""
    if not verdict.cost:
        return (
            "cost of enabling adaptive: not measured (no load where the plan runs the static "
            "pick's own steps with its NCCL set)"
        )
    parts = []
    for load, cost, noise in verdict.cost:
        static = next(c.static.mean for c in verdict.loads if c.concurrency == load)
        parts.append(f"concurrency {load}: {cost:+.1f} ± {noise:.1f} tok/s ({cost / static:+.1%})")
    return (
        "cost of enabling adaptive (static pick - plan where the plan runs the pick's own "
        f"steps and NCCL set): {'; '.join(parts)}"
    )


def verdict_lines(verdict: PlanVerdict) -> list[str]:
    """The verification as the terminal prints it."""
    trials = ", ".join(map(str, verdict.trials))
    label = verdict.plan.candidate().label()
    out = [f"plan verified (trial {trials}): {label}"]
    rows = [VERDICT_HEADER, *verdict_rows(verdict)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(VERDICT_HEADER))]
    out += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
            for r in rows]  # fmt: skip
    out.append(f"  {verdict.why}")
    out.append(f"  {cost_line(verdict)}")
    return out
