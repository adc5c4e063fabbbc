"""The plan's verification: after the search, the per-load plan itself measured at every load.

The search measures static configurations; the plan (SGLang's adaptive tiers: each load's best
chain, or no speculation) is built from them (:mod:`rayspec.tune._tiers`) and never ran. Here it
runs: ``study.verify_plan`` server starts launched with ``--speculative-adaptive
--speculative-adaptive-config FILE`` (the file written on the node from the launch spec,
:func:`rayspec.server._files.with_files`), measured with the experiment's protocol at every
scenario, in full (never pruned; the objective's runs up to ``bench.max_repeats``). Each is an
Optuna trial of its own with role ``plan``, stored in Parquet like any other, and recorded
through the same :class:`~rayspec.tune._recorder.Recorder` (the correctness gate included); a
failure is a row, never the study's.

Budget: while the plan is unverified, ``study.verify_plan`` restarts of ``study.max_restarts``
are kept out of the search (:attr:`~rayspec.tune._budget.Budget.reserved`), so the search stops
that many launches early and the verification always has its starts. Where no plan comes out of
the search (speculation best at no load), the kept restarts are left unspent.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Sequence

from rayspec._config import ExperimentConfig
from rayspec._exceptions import FailureReason
from rayspec._plural import plural
from rayspec._types import RunDecision
from rayspec._types import TrialRecord
from rayspec._types import TrialResult
from rayspec.results import PLAN_PARAM
from rayspec.results import PLAN_ROLE
from rayspec.results import StudyReport
from rayspec.search import StudyHandle
from rayspec.search import canonical_key
from rayspec.tune._budget import Budget
from rayspec.tune._progress import TrialLines
from rayspec.tune._recorder import Recorder
from rayspec.tune._tiers import adaptive_tiers
from rayspec.tune._tiers import plan_may_apply
from rayspec.tune._trial import failed_result

__all__ = ["plan_reserve", "verify_plan"]


def _verified(records: Sequence[TrialRecord], key: str | None = None) -> int:
    """Launched verification trials (of the plan whose key is ``key``, or of any plan)."""
    return sum(
        1
        for r in records
        if r.role == PLAN_ROLE and r.launched and (key is None or r.candidate_key == key)
    )


def _in_full(number: int, runs: Sequence[float]) -> RunDecision:
    """Every run up to ``bench.max_repeats``: the plan is compared with a pick measured as far
    (runs on a started server are cheap; a restart is not)."""
    del number, runs
    return RunDecision.EXTEND


def plan_reserve(cfg: ExperimentConfig, records: Sequence[TrialRecord]) -> int:
    """Restarts to keep out of the search for the plan's verification (0: none needed)."""
    if cfg.study.verify_plan == 0 or not plan_may_apply(cfg):
        return 0
    return max(0, cfg.study.verify_plan - _verified(records))


def verify_plan(
    cfg: ExperimentConfig,
    handle: StudyHandle,
    report: StudyReport,
    records: Sequence[TrialRecord],
    budget: Budget,
    record: Recorder,
    trial_fn: Callable[..., TrialResult],
    lines: TrialLines,
    printer: Callable[[str], None],
) -> int:
    """Run the plan's verification trials that are due; returns how many ran.

    Args:
        report: the study's report after the search (the plan is built from it).
        records: every stored trial (the verifications already done are counted).
        budget: the search's budget (``reserved`` is released here).
    """
    budget.reserved = 0
    if cfg.study.verify_plan == 0:
        return 0
    found = adaptive_tiers(cfg, report)
    if found is None:
        if plan_may_apply(cfg):
            printer("plan: none to verify (speculation was best at no load, or no chain ran)")
        return 0
    candidate = found.plan.candidate()
    key = canonical_key(candidate)
    due = cfg.study.verify_plan - _verified(records, key)
    ran = 0
    for _ in range(due):
        why = budget.why_not(0)
        if why:
            printer(f"plan not verified: {why}")
            break
        trial = handle.ask_outside(
            candidate, {PLAN_PARAM: found.plan.to_json()}, role=PLAN_ROLE,
            reason="the per-load plan (adaptive tiers) measured at every load",
        )  # fmt: skip
        lines.sink.trial_started(trial.number, candidate.label())
        printer(f"trial {trial.number}: verifying the plan, {candidate.label()}")
        try:
            result = trial_fn(
                cfg, trial.number, candidate, slot=0, on_phase=lines.phase, on_runs=_in_full
            )
        except Exception as exc:  # noqa: BLE001 - recorded as the trial's failure, not the study's
            result = failed_result(
                trial.number, candidate, FailureReason.UNKNOWN, f"{type(exc).__name__}: {exc}"
            )
        record(trial, result, None)
        ran += 1
    if ran:
        printer(f"plan: {plural(ran, 'verification trial')} ran")
    return ran
