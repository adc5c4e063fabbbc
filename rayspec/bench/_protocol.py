"""The measurement protocol of one server start, written once: the plan's runs with a decision
after each (a hopeless trial stops early: pruned), then more runs on the same start for a close
one (up to ``max_repeats``, while the decision says extend).

:func:`measure` holds the loop; how runs are run is the caller's ``run``: a real trial runs
them on the bench actor beside its server (``tune/_trial.py``), a simulated one in process on
the twin's model (``testing/_simtrial.py``). Both get the same plans and the same decisions at
the same points, so the search benchmark measures what a study does.

Example::

    result, pruned = measure(plan, run_on_actor, max_repeats=8, decide=driver_says)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Sequence

from rayspec._types import RunDecision
from rayspec.bench._plan import BenchPlan
from rayspec.bench._runner import BenchResult

__all__ = ["Decide", "RunPlan", "Watch", "extension", "measure", "objective_runs"]

#: Called with the objective scenario's run values of the plan being run so far, after each
#: finished run (several at once if they finished together); True stops the plan there.
Watch = Callable[[Sequence[float]], bool]
#: Runs a plan on the server, asking ``watch`` (when given) as its runs finish.
RunPlan = Callable[[BenchPlan, Watch | None], BenchResult]
#: Called with every objective-scenario run value of the start so far: go on, prune, extend.
Decide = Callable[[Sequence[float]], RunDecision]


def objective_runs(result: BenchResult, scenario: str) -> list[float]:
    """The measured runs' throughputs of ``scenario`` (warm-up left out), in order."""
    return [r.tok_s for r in result.runs if r.scenario == scenario and r.run >= 0]


def extension(plan: BenchPlan, done: int, max_repeats: int) -> BenchPlan:
    """More runs of the objective (first) scenario on the same server after ``done`` measured
    runs: no flush, no warm-up, run numbers (and prompts) continuing where the plan stopped."""
    return dataclasses.replace(
        plan,
        scenarios=plan.scenarios[:1],
        warmup=0,
        flush_cache=False,
        first_run=done,
        repeats=max(1, max_repeats - done),
    )


def measure(
    plan: BenchPlan,
    run: RunPlan,
    *,
    max_repeats: int,
    decide: Decide | None = None,
    on_extend: Callable[[int], None] | None = None,
) -> tuple[BenchResult, bool]:
    """Run ``plan`` and, for a close result, its extension; returns the result and "pruned".

    Args:
        plan: the start's plan; its first scenario is the objective's.
        run: runs a plan (see :data:`RunPlan`).
        max_repeats: the most measured runs of the objective scenario on one start.
        decide: asked after each run; None: the plan as it is, no pruning, no extension.
        on_extend: told how many more runs at most, when the plan is extended.
    """
    scenario = plan.scenarios[0].name
    decision = RunDecision.CONTINUE

    def watch_plan(values: Sequence[float]) -> bool:
        nonlocal decision
        assert decide is not None
        decision = decide(values)
        return decision is RunDecision.PRUNE

    result = run(plan, watch_plan if decide is not None else None)
    if decision is RunDecision.PRUNE:
        return result, True
    done = objective_runs(result, scenario)
    if decision is not RunDecision.EXTEND or result.stopped or len(done) >= max_repeats:
        return result, False
    if on_extend is not None:
        on_extend(max_repeats - len(done))

    def watch_more(values: Sequence[float]) -> bool:
        nonlocal decision
        assert decide is not None
        decision = decide([*done, *values])
        return decision is not RunDecision.EXTEND

    more = run(extension(plan, len(done), max_repeats), watch_more)
    merged = BenchResult(
        records=result.records + more.records, runs=result.runs + more.runs, stopped=more.stopped
    )
    return merged, False
