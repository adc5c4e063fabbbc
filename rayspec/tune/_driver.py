"""The study loop: ask Optuna, run trials on free slots, store every result, tell Optuna.

Order of writes per trial: the Parquet row first, then ``tell``. A driver killed between the two
leaves a RUNNING trial whose row exists; the next driver tells Optuna from that row, so the two
stores agree and nothing measured is lost. A trial with no row is failed as interrupted and its
configuration is queued again.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rayspec._config import ExperimentConfig
from rayspec._exceptions import FailureReason
from rayspec._types import Candidate
from rayspec._types import TrialResult
from rayspec.search import SearchSpace
from rayspec.search import StudyHandle
from rayspec.search import canonical_key
from rayspec.search import open_study
from rayspec.search._study import ATTR_RETRY_OF
from rayspec.store import ParquetTrialStore
from rayspec.tune._report import StudyReport
from rayspec.tune._report import build_report
from rayspec.tune._trial import failed_result
from rayspec.tune._trial import run_trial

__all__ = ["StudyOutcome", "run_study"]

_log = logging.getLogger(__name__)

Printer = Callable[[str], None]


@dataclass(frozen=True)
class StudyOutcome:
    report: StudyReport
    ran: int  # trials finished by this invocation
    resumed_from: int  # finished trials found in storage at start
    wall_s: float


class _Progress:
    """Progress lines: trial n of N, phase, best so far."""

    def __init__(self, total: int, done: int, printer: Printer) -> None:
        self.total = total
        self.done = done
        self.best: tuple[float, int] | None = None
        self.print = printer

    def phase(self, trial: int, phase: str) -> None:
        self.print(f"[trial {trial}] {phase}")

    def finished(self, result: TrialResult) -> None:
        self.done += 1
        if result.state == "COMPLETE" and result.value is not None:
            if self.best is None or result.value > self.best[0]:
                self.best = (result.value, result.trial)
            what = f"{result.value:.1f} tok/s"
            acc = result.metrics.get("accept_length")
            if acc is not None and acc == acc:
                what += f", accept len {acc:.2f}"
        else:
            what = f"{result.state} ({result.failure or 'no reason'})"
        best = (
            f"best {self.best[0]:.1f} tok/s (trial {self.best[1]})" if self.best else "no best yet"
        )
        self.print(
            f"[{self.done}/{self.total}] trial {result.trial}: {result.candidate.label()} -> "
            f"{what}; {best}"
        )


def _roles(handle: StudyHandle) -> dict[int, str]:
    roles: dict[int, str] = {}
    for t in handle.study.get_trials(deepcopy=False):
        role = t.user_attrs.get("role")
        if role:
            roles[t.number] = str(role)
        retry = t.user_attrs.get(ATTR_RETRY_OF)
        if retry is not None and int(retry) in roles:
            roles[t.number] = roles[int(retry)]
    return roles


def _extra(params: dict[str, Any], attrs: dict[str, Any]) -> dict[str, object]:
    """Trial columns the study knows and the result does not."""
    extra: dict[str, object] = {"params": json.dumps(params, sort_keys=True)}
    if "candidate_key" in attrs:
        extra["candidate_key"] = attrs["candidate_key"]
    if "reused_from" in attrs:
        extra["note"] = f"reused the measurement of trial {attrs['reused_from']}"
    return extra


def _recover(handle: StudyHandle, store: ParquetTrialStore, printer: Printer) -> None:
    """Reconcile Optuna with Parquet after a killed driver."""
    from optuna.trial import TrialState

    stored = {int(r["trial"]): r for r in store.load_trials().to_pylist()}
    running = handle.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    for t in running:
        row = stored.get(t.number)
        if (
            row is not None
            and row["state"] in ("COMPLETE", "PRUNED", "FAIL")
            and (row.get("failure") != FailureReason.INTERRUPTED.value)
        ):
            state = {"COMPLETE": TrialState.COMPLETE, "PRUNED": TrialState.PRUNED,
                     "FAIL": TrialState.FAIL}[row["state"]]  # fmt: skip
            value = row["value"] if state is TrialState.COMPLETE else None
            handle.study.tell(t.number, value, state=state, skip_if_finished=True)
            printer(f"recovered trial {t.number} from its Parquet row ({row['state']})")
    stale = handle.recover_interrupted()
    for t in stale:
        params = dict(t.params)
        try:
            candidate = handle.space.candidate(params) if params else Candidate()
        except Exception:  # noqa: BLE001 - a foreign param set: still record the failure
            candidate = Candidate()
        result = failed_result(
            t.number,
            candidate,
            FailureReason.INTERRUPTED,
            "the driver stopped while this trial ran; its configuration was queued again",
            start=t.datetime_start.timestamp() if t.datetime_start else None,
        )
        store.append_trial(result, _extra(params, dict(t.user_attrs)))
        printer(f"trial {t.number} was interrupted by the last driver: failed, queued again")


def run_study(
    cfg: ExperimentConfig,
    *,
    printer: Printer = print,
    slots: int = 1,
    trial_fn: Callable[..., TrialResult] = run_trial,
) -> StudyOutcome:
    """Create or resume the study and run it up to ``study.n_trials`` finished trials."""
    t0 = time.monotonic()
    space = SearchSpace.from_config(cfg.search)
    store = ParquetTrialStore(cfg.out_dir)
    handle = open_study(cfg, space)
    _recover(handle, store, printer)
    done_before = len(handle.finished())
    todo = handle.remaining(cfg.study.n_trials)
    if done_before:
        printer(f"resuming study {cfg.study.name}: {done_before} trials done, {todo} to go")
    progress = _Progress(cfg.study.n_trials, done_before, printer)
    ran = 0

    def record(trial: Any, candidate: Candidate, result: TrialResult) -> None:
        nonlocal ran
        store.append_trial(result, _extra(dict(trial.params), dict(trial.user_attrs)))
        handle.tell(trial, result)
        ran += 1
        progress.finished(result)

    pending: dict[cf.Future[TrialResult], tuple[Any, Candidate, int]] = {}
    free_slots = list(range(slots))
    with cf.ThreadPoolExecutor(max_workers=slots, thread_name_prefix="trial") as pool:
        try:
            while True:
                while free_slots and ran + len(pending) < todo and not handle.exhausted():
                    trial, candidate = handle.ask()
                    instant = _instant_result(handle, trial, candidate)
                    if instant is not None:
                        record(trial, candidate, instant)
                        continue
                    slot = free_slots.pop(0)
                    future = pool.submit(
                        trial_fn, cfg, trial.number, candidate, slot=slot,
                        on_phase=progress.phase,
                    )  # fmt: skip
                    pending[future] = (trial, candidate, slot)
                if not pending:
                    break
                finished, _ = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                for future in finished:
                    trial, candidate, slot = pending.pop(future)
                    free_slots.append(slot)
                    record(trial, candidate, future.result())
        except BaseException:
            for future in pending:
                future.cancel()
            raise
    roles = _roles(handle)
    report = build_report(store.load_trials().to_pylist(), roles)
    return StudyOutcome(report, ran, done_before, time.monotonic() - t0)


def _instant_result(handle: StudyHandle, trial: Any, candidate: Candidate) -> TrialResult | None:
    """Results that need no server: an impossible draft tree, or a candidate measured before."""
    spec = candidate.spec
    if spec is not None and not spec.fits_tree:
        return failed_result(
            trial.number,
            candidate,
            FailureReason.INFEASIBLE,
            f"num_draft_tokens {spec.num_draft_tokens} - 1 exceeds the draft tree's "
            f"{spec.tree_capacity} nodes (topk {spec.eagle_topk}, {spec.num_steps} steps): "
            "SGLang would fail at the first decode, so it was not launched",
        )
    key = canonical_key(candidate)
    previous = handle.completed_by_key().get(key)
    if previous is not None and previous.number != trial.number:
        trial.set_user_attr("reused_from", previous.number)
        now = time.time()
        metrics = {
            k: float(v)
            for k, v in previous.user_attrs.items()
            if k in ("tok_s_mean", "tok_s_peak", "tok_s_std", "accept_length")
        }
        return TrialResult(
            trial=trial.number,
            state="COMPLETE",
            value=previous.value,
            candidate=candidate,
            launch=None,
            metrics=metrics,
            requests=(),
            start_unix_s=now,
            end_unix_s=now,
            failure_detail=f"same configuration as trial {previous.number}: result reused",
        )
    return None
