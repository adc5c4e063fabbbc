"""The study loop: ask Optuna, run trials on free slots, store every result, tell Optuna.

Order of writes per trial: the Parquet row first, then ``tell``. A driver killed between the two
leaves a RUNNING trial whose row exists; the next driver tells Optuna from that row, so the two
stores agree and nothing measured is lost. A trial with no row is failed as interrupted and its
configuration is queued again.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import json
import logging
import math
import threading
import time
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rayspec._config import ExperimentConfig
from rayspec._exceptions import ConfigError
from rayspec._exceptions import FailureReason
from rayspec._types import Candidate
from rayspec._types import TrialResult
from rayspec.bench import per_run_tok_s
from rayspec.search import SearchSpace
from rayspec.search import StudyHandle
from rayspec.search import canonical_key
from rayspec.search import open_study
from rayspec.search._study import ATTR_RETRY_OF
from rayspec.store import ParquetTrialStore
from rayspec.tune._decide import Measured
from rayspec.tune._decide import cannot_beat
from rayspec.tune._decide import comparison_metrics
from rayspec.tune._report import StudyReport
from rayspec.tune._report import build_report
from rayspec.tune._report import candidate_from_row
from rayspec.tune._trial import LIVE_ACTORS
from rayspec.tune._trial import failed_result
from rayspec.tune._trial import objective_scenario
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
    pruned: int = 0  # trials this invocation stopped early
    bench_s_saved: float = 0.0  # benchmark time those stops saved (estimated from run times)


class _Ledger:
    """The measured trials the decisions need: baseline, incumbent, per-run values.

    Shared between the trial threads (pruning) and the main thread (recording): guarded.
    """

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self._lock = threading.Lock()
        self._measured: dict[int, Measured] = {}
        self.baseline: int | None = None

    def add(self, m: Measured) -> None:
        with self._lock:
            self._measured[m.trial] = m

    def get(self, trial: int) -> Measured | None:
        with self._lock:
            return self._measured.get(trial)

    def incumbent(self) -> Measured | None:
        with self._lock:
            ranked = [m for m in self._measured.values() if math.isfinite(m.mean)]
        return max(ranked, key=lambda m: m.mean) if ranked else None

    def comparisons(self, runs: list[float]) -> dict[str, float]:
        """This trial against the baseline and the incumbent (ratio, CI, p, significant)."""
        out: dict[str, float] = {}
        base = self.get(self.baseline) if self.baseline is not None else None
        if base is not None:
            out |= comparison_metrics("vs_baseline", runs, base.runs, self.alpha)
        inc = self.incumbent()
        if inc is not None:
            out |= comparison_metrics("vs_incumbent", runs, inc.runs, self.alpha)
            out["incumbent_trial"] = float(inc.trial)
        return out


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
        elif result.state == "PRUNED":
            mean = result.metrics.get("tok_s_mean", math.nan)
            what = f"pruned at {mean:.1f} tok/s ({result.failure_detail})"
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


def _extra(
    params: dict[str, Any], attrs: dict[str, Any], runs: list[float] | None = None
) -> dict[str, object]:
    """Trial columns the study knows and the result does not."""
    extra: dict[str, object] = {"params": json.dumps(params, sort_keys=True)}
    if runs:
        extra["run_values"] = json.dumps([round(v, 6) for v in runs])
    if "candidate_key" in attrs:
        extra["candidate_key"] = attrs["candidate_key"]
    if "reused_from" in attrs:
        extra["note"] = f"reused the measurement of trial {attrs['reused_from']}"
    return extra


def _candidate_of(handle: StudyHandle, params: dict[str, Any]) -> Candidate:
    try:
        return handle.space.candidate(params) if params else Candidate()
    except ConfigError:  # the space changed since: still record what happened
        return Candidate()


def _recover(handle: StudyHandle, store: ParquetTrialStore, printer: Printer) -> None:
    """Reconcile Optuna with Parquet after a killed driver.

    Every step is idempotent and ordered so that a driver killed in the middle of it leaves a
    state the next run repairs: the Parquet row first, then the retry, then Optuna's state.
    """
    from optuna.trial import TrialState

    stored = {int(r["trial"]): r for r in store.load_trials().to_pylist()}
    states = {"COMPLETE": TrialState.COMPLETE, "PRUNED": TrialState.PRUNED,
              "FAIL": TrialState.FAIL}  # fmt: skip
    interrupted = FailureReason.INTERRUPTED.value
    for t in handle.running():
        row = stored.get(t.number)
        if row is not None and row.get("failure") != interrupted:
            # Measured and stored, but the driver died before telling Optuna: nothing lost.
            state = states[row["state"]]
            value = row["value"] if state is TrialState.COMPLETE else None
            handle.study.tell(t.number, value, state=state, skip_if_finished=True)
            printer(f"recovered trial {t.number} from its Parquet row ({row['state']})")
            continue
        params = dict(t.params)
        if row is None:
            result = failed_result(
                t.number,
                _candidate_of(handle, params),
                FailureReason.INTERRUPTED,
                "the driver stopped while this trial ran; its configuration was queued again",
                start=t.datetime_start.timestamp() if t.datetime_start else None,
            )
            store.append_trial(result, _extra(params, dict(t.user_attrs)))
            stored[t.number] = {"failure": interrupted}
        handle.requeue(t)
        handle.fail(t.number)
        printer(f"trial {t.number} was interrupted by the last driver: failed, queued again")
    # A finished trial without a row (only a driver of an older order could leave one).
    finished = handle.study.get_trials(deepcopy=False, states=tuple(states.values()))
    retried = handle.interrupted()
    for t in finished:
        if t.number in stored:
            continue
        params = dict(t.params)
        reason = interrupted if t.number in retried else t.user_attrs.get("failure_reason")
        result = TrialResult(
            trial=t.number, state=t.state.name, value=t.value,
            candidate=_candidate_of(handle, params), launch=None, metrics={}, requests=(),
            start_unix_s=t.datetime_start.timestamp() if t.datetime_start else time.time(),
            end_unix_s=t.datetime_complete.timestamp() if t.datetime_complete else time.time(),
            failure=None if t.state is TrialState.COMPLETE else (reason or "unknown"),
            failure_detail="rebuilt from the Optuna storage (no Parquet row was written)",
        )  # fmt: skip
        store.append_trial(result, _extra(params, dict(t.user_attrs)))
        printer(f"trial {t.number}: Parquet row rebuilt from the Optuna storage")


def _load_ledger(
    cfg: ExperimentConfig, store: ParquetTrialStore, roles: dict[int, str]
) -> _Ledger:
    ledger = _Ledger(cfg.study.alpha)
    for row in store.load_trials().to_pylist():
        if row["state"] != "COMPLETE" or not row.get("run_values") or row.get("note"):
            continue
        runs = tuple(float(v) for v in json.loads(row["run_values"]))
        ledger.add(Measured(int(row["trial"]), candidate_from_row(row), runs))
    ledger.baseline = next((n for n, r in roles.items() if r == "baseline"), None)
    return ledger


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
    ledger = _load_ledger(cfg, store, _roles(handle))
    scenario = objective_scenario(cfg)
    live: dict[int, Any] = {}  # trial number -> optuna trial, for intermediate values
    protected: set[int] = set()  # the baseline and enqueued references are measured in full
    ran = pruned = 0
    saved_s = 0.0

    def on_runs(number: int, runs: Sequence[float]) -> bool:
        """After each run: report the running mean; prune a trial that cannot win."""
        trial = live.get(number)
        if trial is not None:
            trial.report(float(sum(runs) / len(runs)), step=len(runs))
        if not cfg.study.pruning or number in protected:
            return False
        incumbent = ledger.incumbent()
        if incumbent is None:
            return False
        return cannot_beat(runs, incumbent.runs, min_runs=cfg.study.prune_min_runs)

    def record(trial: Any, candidate: Candidate, result: TrialResult) -> None:
        nonlocal ran, pruned, saved_s
        runs = [v for v in per_run_tok_s(result.requests, scenario).values() if math.isfinite(v)]
        if result.state in ("COMPLETE", "PRUNED") and runs:
            metrics = dict(result.metrics) | ledger.comparisons(runs)
            result = dataclasses.replace(result, metrics=metrics)
        store.append_trial(result, _extra(dict(trial.params), dict(trial.user_attrs), runs))
        handle.tell(trial, result)
        if result.state == "COMPLETE" and runs and result.launch is not None:
            ledger.add(Measured(result.trial, candidate, tuple(runs)))
        if result.state == "PRUNED":
            pruned += 1
            saved_s += float(result.metrics.get("bench_s_saved", 0.0))
        live.pop(result.trial, None)
        ran += 1
        progress.finished(result)

    pending: dict[cf.Future[TrialResult], tuple[Any, Candidate, int]] = {}
    free_slots = list(range(slots))
    with cf.ThreadPoolExecutor(max_workers=slots, thread_name_prefix="trial") as pool:
        try:
            while True:
                while free_slots and ran + len(pending) < todo and not handle.exhausted():
                    trial, candidate = handle.ask()
                    role = trial.user_attrs.get("role")
                    if role:
                        protected.add(trial.number)
                        if role == "baseline":
                            ledger.baseline = trial.number
                    instant = _instant_result(handle, trial, candidate)
                    if instant is not None:
                        record(trial, candidate, instant)
                        continue
                    slot = free_slots.pop(0)
                    live[trial.number] = trial
                    future = pool.submit(
                        trial_fn, cfg, trial.number, candidate, slot=slot,
                        on_phase=progress.phase, on_runs=on_runs,
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
            # Ctrl-C, SIGTERM or a bug: stop every running server now rather than letting the
            # pool wait for trials to finish; their trials stay RUNNING and are retried on resume.
            for future in pending:
                future.cancel()
            LIVE_ACTORS.kill_all()
            raise
    roles = _roles(handle)
    report = build_report(
        store.load_trials().to_pylist(),
        roles,
        alpha=cfg.study.alpha,
        margin=cfg.study.pick_margin,
    )
    return StudyOutcome(report, ran, done_before, time.monotonic() - t0, pruned, saved_s)


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
