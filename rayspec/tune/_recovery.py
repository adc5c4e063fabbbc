"""Reconciling Optuna with Parquet after a killed driver, before the study goes on; queueing
again a trial lost with its node.

Order of writes per trial is the Parquet row first, then ``tell``. A driver killed between the
two leaves a RUNNING trial whose row exists; the next driver tells Optuna from that row, so the
two stores agree and nothing measured is lost. A trial with no row is failed as interrupted and
its configuration is queued again. A trial measured while the baseline still ran, whose row a
stopping driver wrote before the correctness gate could judge it, is recorded by the next
driver once the baseline's outputs are in (not measured again, not recorded unjudged).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

from rayspec._exceptions import ConfigError
from rayspec._exceptions import FailureReason
from rayspec._types import Candidate
from rayspec._types import RequestRecord
from rayspec._types import TrialRecord
from rayspec._types import TrialResult
from rayspec.results import candidate_reader
from rayspec.search import StudyHandle
from rayspec.search import TrialHandle
from rayspec.search._space import ATTR_QUEUED
from rayspec.search._study import ATTR_AWAITS
from rayspec.search._study import ATTR_OUTSIDE
from rayspec.store import ParquetTrialStore
from rayspec.store import request_record
from rayspec.tune._trial import failed_result

__all__ = ["recover", "retry_lost", "set_aside_trials"]


def _candidate_of(handle: StudyHandle, params: dict[str, Any]) -> Candidate:
    try:
        return handle.space.candidate(params) if params else Candidate()
    except ConfigError:  # the space changed since: still record what happened
        return Candidate()


def recover(
    handle: StudyHandle, store: ParquetTrialStore, printer: Callable[[str], None]
) -> list[int]:
    """Reconcile Optuna with Parquet after a killed driver.

    Every step is idempotent and ordered so that a driver killed in the middle of it leaves a
    state the next run repairs: the Parquet row first, then the retry, then Optuna's state.

    Returns:
        The trials measured before the last driver stopped that await the baseline's outputs
        (:data:`~rayspec.search._study.ATTR_AWAITS`): left RUNNING for the driver to record
        once it has them (:func:`set_aside_trials`).
    """
    stored = {r.trial: r.result for r in store.load_records(candidate_reader(handle.space))}
    interrupted = FailureReason.INTERRUPTED.value
    aside: list[int] = []
    for t in handle.running():
        row = stored.get(t.number)
        if row is not None and row.failure != interrupted and t.attrs.get(ATTR_AWAITS):
            aside.append(t.number)
            printer(f"trial {t.number} was measured before the last driver stopped and waits "
                    "for the baseline's outputs: recorded once the baseline is")  # fmt: skip
            continue
        if row is not None and row.failure != interrupted:
            # Measured and stored, but the driver died before telling Optuna: nothing lost.
            handle.tell_stored(row)
            printer(f"recovered trial {t.number} from its Parquet row ({row.state.value})")
            continue
        if row is None:
            # Its configuration as queued (a kill while it was being sampled leaves some
            # parameters only): a row's parameters are always a whole configuration, or none.
            outside = t.attrs.get(ATTR_OUTSIDE)  # a plan's verification: not of the space
            params = dict(outside or t.attrs.get(ATTR_QUEUED) or t.params)
            try:
                if not outside:
                    handle.space.candidate(params) if params else None
            except ConfigError:
                params = {}
            result = failed_result(
                t.number,
                candidate_reader(handle.space)(params)
                if outside
                else _candidate_of(handle, params),
                FailureReason.INTERRUPTED,
                "the driver stopped while this trial ran; its configuration was queued again",
                start=t.start_unix_s,
            )
            repeat = t.attrs.get("repeat_of")
            store.append_trial(TrialRecord(
                result, params=params, candidate_key=str(t.attrs.get("candidate_key", "")),
                role=str(t.attrs.get("role", "")), reason=str(t.attrs.get("reason", "")),
                repeat_of=int(repeat) if repeat is not None else None,
            ))  # fmt: skip
            stored[t.number] = result
        if t.attrs.get(ATTR_OUTSIDE):  # run again after the search if still unverified
            handle.fail(t.number)
            printer(f"trial {t.number} (the plan's verification) was interrupted: failed")
            continue
        handle.requeue(t)
        handle.fail(t.number)
        printer(f"trial {t.number} was interrupted by the last driver: failed, queued again")
    # A finished trial without a row was rebuilt before the study was opened (_agree.py).
    return aside


def set_aside_trials(
    handle: StudyHandle, store: ParquetTrialStore, numbers: Sequence[int]
) -> list[tuple[TrialHandle, TrialResult]]:
    """The trials :func:`recover` left awaiting the baseline, as the driver records them: a
    live handle each, and the result its row and request rows hold."""
    if not numbers:
        return []
    records = {r.trial: r for r in store.load_records(candidate_reader(handle.space))}
    wanted = set(numbers)
    requests: dict[int, list[RequestRecord]] = {n: [] for n in numbers}
    for row in store.load_requests().to_pylist():
        if int(row["trial"]) in wanted:
            requests[int(row["trial"])].append(request_record(row))
    out = []
    for n in numbers:
        result = dataclasses.replace(records[n].result, requests=tuple(requests[n]))
        out.append((handle.running_trial(n, result.candidate), result))
    return out


def retry_lost(
    handle: StudyHandle, trial: TrialHandle, result: TrialResult, printer: Callable[[str], None]
) -> None:
    """Queue again (once) the configuration of a trial whose node or server actor died.

    Called before the trial's row is written: a driver killed in between leaves a RUNNING
    trial whose retry exists, and :func:`recover` does not queue another.
    """
    if result.failure not in (FailureReason.NODE_LOST, FailureReason.ACTOR_LOST):
        return
    again = handle.retry_elsewhere(trial)
    what = ("its node died" if result.failure == FailureReason.NODE_LOST
            else "its server actor's worker died")  # fmt: skip
    printer(
        f"trial {trial.number}: {what} ({result.node}); "
        + ("queued again for another node" if again
           else "not queued again (it was the retry of a lost trial)")
    )  # fmt: skip
