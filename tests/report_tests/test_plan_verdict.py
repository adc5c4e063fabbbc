"""The plan against the static pick per load: the figures' intervals and the recommendation rule
(pure functions of stored records)."""

from __future__ import annotations

import math

import pytest

from rayspec import Candidate
from rayspec import SpecSettings
from rayspec._types import LaunchSpec
from rayspec._types import TrialRecord
from rayspec._types import TrialResult
from rayspec._types import TrialState
from rayspec.results import PLAN_PARAM
from rayspec.results import PLAN_ROLE
from rayspec.results import Plan
from rayspec.results import build_report
from rayspec.results import plan_verdict
from rayspec.results import verdict_lines
from rayspec.results._plan import Figure
from rayspec.results._plan import LoadCheck
from rayspec.results._plan import figure
from rayspec.results._plan import recommend

NCCL = (("NCCL_PROTO", "LL"),)
CHAIN = SpecSettings("EAGLE3", 2, 1, 3)
LOADS = [("c1", 1), ("c16", 16)]


def _record(trial: int, cand: Candidate, c1: float, c16: float, *, role: str = "",
            params: dict | None = None, sd: float = 1.0) -> TrialRecord:  # fmt: skip
    metrics = {
        "tok_s_mean": c1, "tok_s_std": sd, "runs": 5.0,
        "c16__tok_s_mean": c16, "c16__tok_s_std": sd * 4, "c16__runs": 3.0,
    }  # fmt: skip
    launch = LaunchSpec(("python",), (), "127.0.0.1", 1, "x.log", 1.0, "twin")
    result = TrialResult(trial, TrialState.COMPLETE, c1, cand, launch, metrics, (), 0.0, 1.0)
    return TrialRecord(result, params=params or {"x": trial}, run_values=(c1,) * 5, role=role,
                       candidate_key=str(trial))  # fmt: skip


def _plan(steps: tuple[int, int]) -> Plan:
    return Plan(((1, (steps[0],)), (16, (steps[1],))), NCCL, "EAGLE3", max(steps))


def _study(plan_c1: float, plan_c16: float, steps: tuple[int, int] = (2, 0)):
    plan = _plan(steps)
    records = [
        _record(0, Candidate(), 60.0, 700.0, role="baseline"),
        _record(1, Candidate(nccl_env=NCCL, spec=CHAIN), 90.0, 560.0),
        _record(2, plan.candidate(), plan_c1, plan_c16, role=PLAN_ROLE,
                params={PLAN_PARAM: plan.to_json()}),
    ]  # fmt: skip
    roles = {r.trial: r.role for r in records if r.role}
    return build_report(records, roles), records


def test_the_plan_is_no_configuration_of_the_pick_but_is_counted() -> None:
    report, _ = _study(200.0, 900.0)
    assert report.best is not None and report.best.trial == 1  # never the plan, however fast
    assert all(PLAN_ROLE != r.role for r in report.rows) and report.total == 3


def test_figure_pools_runs_and_one_start_offset_per_start() -> None:
    r = _record(1, Candidate(), 100.0, 500.0, sd=2.0)
    f = figure([r], None, 0.01)
    assert f.mean == 100.0
    assert f.half == pytest.approx(1.96 * math.sqrt(4.0 / 5 + 1.0))
    two = figure([r, _record(2, Candidate(), 110.0, 500.0, sd=2.0)], None, 0.01)
    assert two.mean == 105.0 and two.half < f.half * 1.2 and two.trials == (1, 2)
    assert figure([r], "c16", 0.01).mean == 500.0


def test_a_plan_slower_than_the_static_pick_beyond_the_noise_is_not_recommended() -> None:
    report, records = _study(89.0, 600.0)  # c1: -1 (noise), c16: +40 (beyond)
    verdict = plan_verdict(report, records, LOADS, objective="c1", start_noise=0.01)
    assert verdict is not None and verdict.recommended, verdict.why
    assert [c.steps for c in verdict.loads] == [2, 0]
    assert verdict.loads[1].better and not verdict.loads[0].worse
    # The static pick runs 2 steps with the plan's NCCL set at c1: there adaptive's cost shows.
    assert [load for load, _, _ in verdict.cost] == [1]
    slow, records = _study(80.0, 600.0)  # c1: -10 tok/s, beyond its noise
    verdict = plan_verdict(slow, records, LOADS, objective="c1", start_noise=0.01)
    assert verdict is not None and not verdict.recommended
    assert "concurrency 1" in verdict.why and "deploy the static pick" in verdict.why
    text = "\n".join(verdict_lines(verdict))
    assert "plan - static" in text and "(worse)" in text and "cost of enabling adaptive" in text


def test_a_plan_that_runs_the_static_pick_everywhere_is_not_recommended() -> None:
    report, records = _study(90.0, 561.0, steps=(2, 2))
    verdict = plan_verdict(report, records, LOADS, objective="c1", start_noise=0.01)
    assert verdict is not None and not verdict.recommended
    assert "only adds its cost" in verdict.why and len(verdict.cost) == 2


def test_the_rule_counts_an_unmeasured_plan_as_not_verified() -> None:
    none = Figure(math.nan, math.nan, ())
    static = Figure(100.0, 2.0, (1,))
    missing = [LoadCheck(1, "c1", 2, none, static, none, math.nan)]
    assert recommend(missing) == (False, recommend(missing)[1])
    assert "did not complete" in recommend(missing)[1]
    tie = [LoadCheck(1, "c1", 2, Figure(99.0, 2.0, (2,)), static, none, 2.8)]
    assert recommend(tie)[0] and "no measured gain" in recommend(tie)[1]


def test_no_verdict_without_a_plan_trial() -> None:
    report, records = _study(90.0, 600.0)
    searched = [r for r in records if r.role != PLAN_ROLE]
    assert plan_verdict(report, searched, LOADS, objective="c1", start_noise=0.01) is None


def test_adaptives_cost_is_read_where_the_nccl_set_is_of_the_picks_screen_class() -> None:
    """A plan whose NCCL set differs from the pick's in name but not in the screen's class runs
    the pick's own settings where its steps are the pick's: there static - plan is the cost."""
    report, records = _study(89.0, 600.0)
    other = Plan(((1, (2,)), (16, (0,))), (("NCCL_PROTO", "LL"), ("NCCL_ALGO", "Ring")),
                 "EAGLE3", 2)  # fmt: skip
    records[2] = _record(2, other.candidate(), 89.0, 600.0, role=PLAN_ROLE,
                         params={PLAN_PARAM: other.to_json()})  # fmt: skip
    plain = plan_verdict(report, records, LOADS, objective="c1", start_noise=0.01)
    assert plain is not None and plain.cost == ()
    one_class = plan_verdict(report, records, LOADS, objective="c1", start_noise=0.01,
                             equivalent=lambda env: "all")  # fmt: skip
    assert one_class is not None and [load for load, _, _ in one_class.cost] == [1]
    assert one_class.cost[0][1] == pytest.approx(1.0)


def test_a_lucky_verification_start_does_not_hide_a_setting_the_search_measured_slower() -> None:
    # The static pick is a tree at one stream; the plan can only run the chain there, which the
    # search started three times at 6 % below the tree. One verification start lands within the
    # noise of the tree (lucky): the search's own starts of the chain still rule the plan out.
    import dataclasses

    tree = Candidate(nccl_env=NCCL, spec=SpecSettings("EAGLE3", 2, 4, 6))
    plan = _plan((2, 0))

    def starts(first: int, cand: Candidate, c1: float, c16: float, key: str) -> list[TrialRecord]:
        return [
            dataclasses.replace(_record(first + i, cand, c1 + i * 0.2, c16), candidate_key=key)
            for i in range(3)
        ]

    records = [
        _record(0, Candidate(), 60.0, 700.0, role="baseline"),
        *starts(1, tree, 100.0, 500.0, "tree"),
        *starts(4, Candidate(nccl_env=NCCL, spec=CHAIN), 94.0, 560.0, "chain"),
        *starts(7, Candidate(nccl_env=NCCL), 60.0, 720.0, "off"),
        _record(10, plan.candidate(), 99.0, 715.0, role=PLAN_ROLE,
                params={PLAN_PARAM: plan.to_json()}),
    ]  # fmt: skip
    report = build_report(records, {r.trial: r.role for r in records if r.role})
    assert report.best is not None and report.best.candidate == tree
    verdict = plan_verdict(report, records, LOADS, objective="c1", start_noise=0.01)
    assert verdict is not None
    c1, c16 = verdict.loads
    assert c1.diff > -c1.noise  # the verification alone would pass it
    assert c1.searched_worse and c1.worse and not c16.worse and c16.better
    assert not verdict.recommended and "as the search measured it" in verdict.why
