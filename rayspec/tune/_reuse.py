"""Results that need no server: a configuration reused from an identical one, or refused
before launch (an impossible draft tree, an NCCL set known to fail, a configuration that
failed). None of them costs a restart."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rayspec._exceptions import FailureReason
from rayspec._plural import plural
from rayspec._types import Candidate
from rayspec._types import TrialResult
from rayspec._types import TrialState
from rayspec.search import Observation
from rayspec.search import StudyHandle
from rayspec.search import TrialHandle
from rayspec.search import canonical_key
from rayspec.search._structured import NCCL_FAILURES
from rayspec.search._study import ROLE_BASELINE_AGAIN
from rayspec.tune._trial import failed_result

__all__ = ["held_result", "instant_result", "nccl_cause"]

# Copied from the reused trial's attributes into the reuse's metrics (slo_violation: the
# reuse carries the SLO constraint its measurement had).
_REUSED_METRICS = (
    "tok_s_mean", "tok_s_peak", "tok_s_std", "accept_length", "goodput", "slo_violation",
)  # fmt: skip


def nccl_cause(
    observations: Sequence[Observation], candidate: Candidate
) -> tuple[int, str, str] | None:
    """Why ``candidate``'s NCCL set is known to fail, if it is: (trial, reason, what).

    A set that failed a launch on an NCCL cause is refused again. So is any set holding the
    common cause of every such failure: the variable values all failed sets share and no
    successful launch used (one bad value, e.g. ``NCCL_PROTO=LL256``, fails every set it is in).
    """
    failed = [
        o for o in observations
        if o.state is TrialState.FAIL and o.launched and o.failure in NCCL_FAILURES
    ]  # fmt: skip
    if not failed:
        return None
    env = set(candidate.nccl_env)
    for o in failed:
        if set(o.candidate.nccl_env) == env:
            return o.trial, str(o.failure), "the same NCCL set"
    innocent = {pair for o in observations if o.measured for pair in o.candidate.nccl_env}
    common = set.intersection(*(set(o.candidate.nccl_env) for o in failed)) - innocent
    if len(failed) >= 2 and common and common <= env:
        named = " ".join(f"{k}={v}" for k, v in sorted(common))
        return failed[-1].trial, str(failed[-1].failure), f"{named} (in every failed NCCL set)"
    return None


def instant_result(
    handle: StudyHandle, trial: TrialHandle, observations: Sequence[Observation]
) -> tuple[TrialResult | None, int | None]:
    """Results that need no server, and the trial whose result is reused (if any).

    An impossible draft tree, an NCCL set that already failed a launch, a configuration that
    already failed (unless ``repeat_of`` asks for another start of one that ran), or (without
    ``repeat_of``) one measured before.
    """
    candidate = trial.candidate
    spec = candidate.spec
    if spec is not None and not spec.fits_tree:
        shape = f"topk {spec.eagle_topk}, {plural(spec.num_steps, 'step')}"
        why = (
            f"num_draft_tokens {spec.num_draft_tokens} - 1 exceeds the draft tree's "
            f"{spec.tree_capacity} nodes ({shape})"
            if spec.holds_path
            else f"num_draft_tokens {spec.num_draft_tokens} is short of the tree's accepted "
            f"path of {spec.num_steps + 1} tokens ({shape})"
        )
        return failed_result(
            trial.number,
            candidate,
            FailureReason.INFEASIBLE,
            f"{why}: SGLang would fail at the first decode, so it was not launched",
        ), None
    if trial.retry_of is not None:
        return None, None  # an interrupted trial is tried again as it was
    cause = nccl_cause(observations, candidate)
    if cause is not None:
        failed_trial, reason, what = cause
        return failed_result(
            trial.number, candidate, FailureReason(reason),
            f"{what} failed the launch of trial {failed_trial} ({reason}): not launched again",
        ), None  # fmt: skip
    key = canonical_key(candidate)
    again = trial.repeat_of is not None or trial.role == ROLE_BASELINE_AGAIN
    failed = handle.failed_by_key().get(key)
    if again and key in handle.completed_by_key():
        # A deliberate new start of a configuration that ran: a failed start of it (killed
        # from outside, a node's hiccup) says how that start ended, not that it cannot run.
        failed = None
    if failed is not None and failed.number != trial.number:
        reason = str(failed.attrs.get("failure_reason", "unknown"))
        trial.set_attr("reused_from", failed.number)
        return failed_result(
            trial.number, candidate, FailureReason(reason),
            f"same configuration as trial {failed.number}, which failed ({reason}): not "
            "launched again",
        ), failed.number  # fmt: skip
    if again:
        return None, None  # a deliberate new server start
    previous = handle.completed_by_key().get(key)
    if previous is not None and previous.number != trial.number:
        trial.set_attr("reused_from", previous.number)
        now = time.time()
        metrics = {k: float(v) for k, v in previous.attrs.items() if k in _REUSED_METRICS}
        return TrialResult(
            trial=trial.number,
            state=TrialState.COMPLETE,
            value=previous.value,
            candidate=candidate,
            launch=None,
            metrics=metrics,
            requests=(),
            start_unix_s=now,
            end_unix_s=now,
            failure_detail=f"same configuration as trial {previous.number}: result reused",
        ), previous.number
    return None, None


def held_result(
    handle: StudyHandle, trial: TrialHandle, observations: Sequence[Observation], stopped: str
) -> tuple[TrialResult, int | None]:
    """The result of a trial held while its configuration ran in another slot, when the study
    stops before it could start: its twin's result reused, else failed as interrupted and its
    configuration queued again (tried on resume, as a trial the driver stopped)."""
    instant, reused_from = instant_result(handle, trial, observations)
    if instant is not None:
        return instant, reused_from
    handle.requeue(trial)
    return failed_result(
        trial.number, trial.candidate, FailureReason.INTERRUPTED,
        f"the study stopped ({stopped or 'no room'}) before this trial, held while the same "
        "configuration ran in another slot, could start; its configuration was queued again",
    ), None  # fmt: skip
