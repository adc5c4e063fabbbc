"""The measurement protocol's one loop (``bench/_protocol.py``): the plan's runs with a decision
after each, pruning, and the extension of a close result. A real trial runs it on the bench
actor, a simulated one in process; here ``run`` is a list of canned throughputs."""

from __future__ import annotations

from collections.abc import Sequence

from rayspec._types import RunDecision
from rayspec.bench import BenchPlan
from rayspec.bench import BenchResult
from rayspec.bench import RunReport
from rayspec.bench import Scenario
from rayspec.bench._protocol import Watch
from rayspec.bench._protocol import extension
from rayspec.bench._protocol import measure

C, E, P = RunDecision.CONTINUE, RunDecision.EXTEND, RunDecision.PRUNE
PLAN = BenchPlan(scenarios=(Scenario(name="single"), Scenario(name="c8", concurrency=8)),
                 warmup=1, repeats=3)  # fmt: skip


class _Server:
    """``run`` for the protocol: run ``i`` (of the objective scenario) measures 100 + i tok/s."""

    def __init__(self) -> None:
        self.plans: list[BenchPlan] = []

    def __call__(self, plan: BenchPlan, watch: Watch | None) -> BenchResult:
        self.plans.append(plan)
        runs: list[RunReport] = []
        for sc in plan.scenarios:
            if plan.warmup:
                runs.append(RunReport(sc.name, -1, (), 1.0, 0.0, 1.0))
            values: list[float] = []
            for i in range(plan.first_run, plan.first_run + plan.repeats):
                runs.append(RunReport(sc.name, i, (), 1.0, 0.0, 100.0 + i))
                if sc is plan.scenarios[0]:
                    values.append(100.0 + i)
                    if watch is not None and watch(values):
                        return BenchResult(records=(), runs=tuple(runs), stopped="callback")
        return BenchResult(records=(), runs=tuple(runs))


def _decider(answers: Sequence[RunDecision], asked: list[list[float]]):  # type: ignore[no-untyped-def]
    def decide(values: Sequence[float]) -> RunDecision:
        asked.append(list(values))
        return answers[min(len(asked), len(answers)) - 1]

    return decide


def _measured(result: BenchResult, scenario: str = "single") -> list[int]:
    return [r.run for r in result.runs if r.scenario == scenario and r.run >= 0]


def test_without_a_decision_the_plan_runs_as_it_is() -> None:
    server = _Server()
    result, pruned = measure(PLAN, server, max_repeats=8)
    assert not pruned and server.plans == [PLAN]
    assert _measured(result) == [0, 1, 2] and _measured(result, "c8") == [0, 1, 2]


def test_a_prune_stops_the_plan_at_that_run() -> None:
    asked: list[list[float]] = []
    result, pruned = measure(PLAN, _Server(), max_repeats=8, decide=_decider([C, P], asked))
    assert pruned and _measured(result) == [0, 1] and _measured(result, "c8") == []
    assert asked == [[100.0], [100.0, 101.0]]


def test_a_close_result_measures_on_while_the_answer_is_extend() -> None:
    asked: list[list[float]] = []
    told: list[int] = []
    server = _Server()
    result, pruned = measure(
        PLAN, server, max_repeats=8, decide=_decider([C, C, E, E, E, C], asked),
        on_extend=told.append,
    )  # fmt: skip
    assert not pruned and told == [5]
    more = server.plans[1]
    assert more == extension(PLAN, 3, 8)
    assert (more.warmup, more.flush_cache, more.first_run, more.repeats) == (0, False, 3, 5)
    assert [s.name for s in more.scenarios] == ["single"]  # the objective's only
    # Every answer sees all runs of the start so far; the extension stops at the first "no".
    assert asked[-1] == [100.0, 101.0, 102.0, 103.0, 104.0, 105.0]
    assert _measured(result) == [0, 1, 2, 3, 4, 5] and result.stopped == "callback"


def test_an_extension_ends_at_max_repeats() -> None:
    asked: list[list[float]] = []
    result, _ = measure(PLAN, _Server(), max_repeats=5, decide=_decider([E], asked))
    assert _measured(result) == [0, 1, 2, 3, 4] and len(asked) == 5


def test_no_extension_past_max_repeats_or_after_a_stop() -> None:
    server = _Server()
    measure(PLAN, server, max_repeats=3, decide=_decider([E], []))
    assert len(server.plans) == 1

    plans: list[BenchPlan] = []

    def stopped(plan: BenchPlan, watch: Watch | None) -> BenchResult:
        plans.append(plan)
        assert watch is not None and not watch([9.0])  # "extend" after the one run
        return BenchResult(records=(), runs=(RunReport("single", 0, (), 1.0, 0.0, 9.0),),
                           stopped="error")  # fmt: skip

    result, pruned = measure(PLAN, stopped, max_repeats=8, decide=_decider([E], []))
    assert not pruned and result.stopped == "error" and plans == [PLAN]
