"""The study loop: screen NCCL, ask for the next configuration, run it on a free slot, store
every result, tell Optuna, until the restart budget is spent or the search has its answer.

The budget is counted in server launches (``study.max_restarts``): a result reused from an
identical configuration, or a configuration refused before launch, costs none. With the default
``structured`` sampler the next configuration comes from
:class:`~rayspec.search.StructuredSearch` and is queued into the Optuna study, which stays the
record (optuna-dashboard shows every trial); with ``tpe``/``random``/``grid`` Optuna's sampler
chooses.

Order of writes per trial: the Parquet row first, then ``tell``. A driver killed between the two
leaves a RUNNING trial whose row exists; the next driver tells Optuna from that row, so the two
stores agree and nothing measured is lost. A trial with no row is failed as interrupted and its
configuration is queued again.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import functools
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rayspec._config import ExperimentConfig
from rayspec._config import Sampler
from rayspec._exceptions import ConfigError
from rayspec._exceptions import FailureReason
from rayspec._plural import plural
from rayspec._types import Candidate
from rayspec._types import RunDecision
from rayspec._types import TrialRecord
from rayspec._types import TrialResult
from rayspec._types import TrialState
from rayspec.bench import per_run_tok_s
from rayspec.bench import request_input
from rayspec.screen import BaseNcclScreen
from rayspec.search import Equivalence
from rayspec.search import Evidence
from rayspec.search import Observation
from rayspec.search import SearchSpace
from rayspec.search import StructuredSearch
from rayspec.search import StudyHandle
from rayspec.search import TrialHandle
from rayspec.search import canonical_key
from rayspec.search import open_study
from rayspec.search import wants_more_runs
from rayspec.search import weigh
from rayspec.search._space import ATTR_QUEUED
from rayspec.search._structured import NCCL_FAILURES
from rayspec.search._study import ROLE_BASELINE_AGAIN
from rayspec.store import ParquetTrialStore
from rayspec.store import request_record
from rayspec.tune._agree import prepare_folder
from rayspec.tune._checks import GATE_UNCHECKED
from rayspec.tune._checks import Chain
from rayspec.tune._checks import OutputGate
from rayspec.tune._checks import acceptance_alarm
from rayspec.tune._checks import prompt_key
from rayspec.tune._decide import Measured
from rayspec.tune._decide import cannot_beat
from rayspec.tune._decide import comparison_metrics
from rayspec.tune._held import HeldTrials
from rayspec.tune._lock import study_lock
from rayspec.tune._metrics import StudyMetrics
from rayspec.tune._metrics import record_exporter
from rayspec.tune._progress import PickView
from rayspec.tune._progress import PlainProgress
from rayspec.tune._report import StudyReport
from rayspec.tune._report import build_report
from rayspec.tune._report import candidate_reader
from rayspec.tune._report import observations_from_records
from rayspec.tune._report import save_space
from rayspec.tune._screen import load_equivalence
from rayspec.tune._screen import run_screen
from rayspec.tune._screen import token_bytes
from rayspec.tune._trial import LIVE_ACTORS
from rayspec.tune._trial import bench_plan
from rayspec.tune._trial import failed_result
from rayspec.tune._trial import objective_scenario
from rayspec.tune._trial import run_trial

__all__ = ["StudyOutcome", "idle_reason", "run_study"]

_log = logging.getLogger(__name__)

Printer = Callable[[str], None]
# A sampler that keeps proposing measured configurations (reused at no cost) is stopped after
# this many such trials in a row.
_MAX_INSTANT_IN_A_ROW = 200
# Draws of running configurations in one round of filling slots before the driver waits for a
# trial to end (each is an Optuna trial that ends as a reuse: a small space must not fill the
# study with them).
_MAX_HOLDS_PER_ROUND = 4


@dataclass(frozen=True)
class StudyOutcome:
    report: StudyReport
    ran: int  # trials finished by this invocation
    resumed_from: int  # finished trials found in storage at start
    wall_s: float
    pruned: int = 0  # trials this invocation stopped early
    bench_s_saved: float = 0.0  # benchmark time those stops saved (estimated from run times)
    restarts: int = 0  # server launches of the whole study
    stopped: str = ""  # why this invocation stopped: budget, converged, n_trials, wall, ...


class _Ledger:
    """The measured trials pruning and the comparison columns need: baseline, incumbent.

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
    """Progress lines: restarts used of the budget, what ran and why, the pick so far; shown
    by ``sink`` (plain lines, or a live display on a terminal)."""

    def __init__(self, budget: int, used: int, sink: PlainProgress) -> None:
        self.budget = budget
        self.used = used
        self.sink = sink
        self.pick = "no pick yet"
        self.pick_view: PickView | None = None

    def set_pick(self, line: str, view: PickView | None) -> None:
        """The pick so far, from every stored trial (a resumed study's earlier ones too)."""
        self.pick, self.pick_view = line, view
        self.sink.status(used=self.used, budget=self.budget, pick=view)

    def phase(self, trial: int, phase: str) -> None:
        self.sink.phase(trial, phase)

    def finished(self, result: TrialResult, trial: TrialHandle, reused_from: int | None) -> None:
        if result.launch is None:  # reused, or refused before launch: no server started
            head = f"[no restart] trial {result.trial}"
        elif not result.costs_restart:  # lost with its node (or interrupted): the retry counts
            head = f"[not counted] trial {result.trial}"
        else:
            self.used += 1
            head = f"[restart {self.used}/{self.budget}] trial {result.trial}"
        why = f" ({trial.role or trial.reason})" if (trial.role or trial.reason) else ""
        if result.state is TrialState.COMPLETE and result.value is not None:
            what = f"{result.value:.1f} tok/s"
            acc = result.metrics.get("accept_length")
            if acc is not None and acc == acc:
                what += f", accept len {acc:.2f}"
            runs = result.metrics.get("runs")
            if runs is not None and runs == runs:
                what += f", {plural(int(runs), 'run')}"
        elif result.state is TrialState.PRUNED:
            mean = result.metrics.get("tok_s_mean", math.nan)
            what = f"pruned at {mean:.1f} tok/s ({result.failure_detail})"
        else:
            what = f"{result.state.value} ({result.failure or 'no reason'})"
        if reused_from is not None:  # no server started: the result is another trial's
            what = f"reused trial {reused_from}: {what}"
        self.sink.line(f"{head}{why}: {result.candidate.label()} -> {what}; {self.pick}")
        self.sink.status(used=self.used, budget=self.budget, pick=self.pick_view)


def _record(
    trial: TrialHandle, result: TrialResult, runs: Sequence[float], restart: int, alarm: str
) -> TrialRecord:
    """The trial's row: the result and what the study knows of it."""
    attrs = trial.attrs
    reused = attrs.get("reused_from")
    return TrialRecord(
        result=result, params=dict(trial.params), run_values=tuple(runs),
        candidate_key=str(attrs.get("candidate_key", "")),
        note=f"reused the measurement of trial {reused}" if reused is not None else "",
        role=trial.role, reason=trial.reason, repeat_of=trial.repeat_of,
        restart=restart if result.launch is not None else None, alarm=alarm,
    )  # fmt: skip


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
    stored = {r.trial: r.result for r in store.load_records(candidate_reader(handle.space))}
    interrupted = FailureReason.INTERRUPTED.value
    for t in handle.running():
        row = stored.get(t.number)
        if row is not None and row.failure != interrupted:
            # Measured and stored, but the driver died before telling Optuna: nothing lost.
            state = row.state
            value = row.value if state is TrialState.COMPLETE else None
            handle.tell_stored(t.number, state, value, row.failure)
            printer(f"recovered trial {t.number} from its Parquet row ({state.value})")
            continue
        if row is None:
            # Its configuration as queued (a kill while it was being sampled leaves some
            # parameters only): a row's parameters are always a whole configuration, or none.
            params = dict(t.attrs.get(ATTR_QUEUED) or t.params)
            try:
                handle.space.candidate(params) if params else None
            except ConfigError:
                params = {}
            result = failed_result(
                t.number,
                _candidate_of(handle, params),
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
        handle.requeue(t)
        handle.fail(t.number)
        printer(f"trial {t.number} was interrupted by the last driver: failed, queued again")
    # A finished trial without a row was rebuilt before the study was opened (_agree.py).


def _load_ledger(cfg: ExperimentConfig, records: Sequence[TrialRecord],
                 roles: dict[int, str]) -> _Ledger:  # fmt: skip
    ledger = _Ledger(cfg.study.alpha)
    for r in records:
        if r.result.state is TrialState.COMPLETE and r.run_values and not r.reused:
            ledger.add(Measured(r.trial, r.candidate, r.run_values))
    # The baseline measured last (an interrupted baseline's retry holds the role too).
    measured = [n for n, r in roles.items() if r == "baseline" and ledger.get(n) is not None]
    ledger.baseline = max(measured, default=None)
    return ledger


class _Budget:
    """Restarts, trials and wall time: what this invocation may still start."""

    def __init__(self, cfg: ExperimentConfig, records: Sequence[TrialRecord], told: int) -> None:
        self.max_restarts = cfg.study.max_restarts
        self.n_trials = cfg.study.n_trials
        self.max_wall_s = cfg.study.max_wall_s
        self.restarts = sum(1 for r in records if r.launched)
        self.told = told
        self.t0 = time.monotonic()

    def why_not(self, in_flight: int, held: int = 0) -> str:
        """Why no further trial may start now ("" when one may); ``held``: trials asked that
        wait for a running one (no server of their own yet)."""
        if self.restarts + in_flight >= self.max_restarts:
            return f"restart budget spent ({self.max_restarts} server launches)"
        if self.n_trials is not None and self.told + in_flight + held >= self.n_trials:
            return f"study.n_trials reached ({plural(self.n_trials, 'trial')})"
        if self.max_wall_s is not None and time.monotonic() - self.t0 >= self.max_wall_s:
            return f"study.max_wall_s reached ({self.max_wall_s:g} s)"
        return ""


class _Room:
    """Slots for running trials: how many fit now, and a slot number for each.

    A fixed count, or a function asked for the cluster's room now. Slot numbers are reused
    in the order they were freed (oldest first), so a port a stopped server just left gets a
    moment before another server binds it.
    """

    poll_s: float | None
    # With no trial running and no room, how long to wait for a node before giving up.
    _WAIT_FOR_NODE_S = 120.0

    def __init__(self, slots: int | Callable[[], int]) -> None:
        self._ask = slots if callable(slots) else None
        self.dynamic = self._ask is not None
        self._fixed = 0 if callable(slots) else int(slots)
        self._free: list[int] = []
        self._next = 0
        self.poll_s = 2.0 if self._ask is not None else None
        self.max_workers = max(1, self._fixed) if self._ask is None else 256
        self.none_left = "no node has room for a trial (server.tp_size GPUs on one node)"

    def now(self) -> int:
        return self._ask() if self._ask is not None else self._fixed

    def free(self, running: int) -> bool:
        return running < min(self.now(), self.max_workers)

    def take(self) -> int:
        if self._free:
            return self._free.pop(0)
        self._next += 1
        return self._next - 1

    def give_back(self, slot: int) -> None:
        self._free.append(slot)

    def wait_for_room(self) -> bool:
        """With nothing running: whether room appeared (a node joined) before the wait ends."""
        deadline = time.monotonic() + self._WAIT_FOR_NODE_S
        while self.now() < 1:
            if time.monotonic() >= deadline:
                return False
            time.sleep(1.0)
        return True


def _halts_study(cfg: ExperimentConfig, number: int, result: TrialResult) -> str:
    """Why a trial's failure stops the study from starting trials ("" when it does not): a
    resource held outside the study, which no other configuration would get past."""
    if result.failure == FailureReason.NO_PLACEMENT.value:
        return (
            f"no room on the cluster: trial {number} was not placed within "
            f"cluster.placement_timeout_s ({cfg.cluster.placement_timeout_s:g} s; "
            "its configuration is queued again for a resume)"
        )
    if result.failure == FailureReason.PORT_IN_USE.value:
        return (
            f"trial {number}'s port was held by another process "
            f"({result.failure_detail[:200]}); no server started and its "
            "configuration is queued again: free the port (or choose another "
            "server.port) and run the same command again"
        )
    return ""


def idle_reason(cfg: ExperimentConfig, printer: Printer = print) -> str:
    """Why a stored study has nothing left to run ("" when it has, or when it is new).

    Read from the study folder alone (Optuna storage and Parquet), so the CLI can say so
    without starting Ray. A study with a trial left running by a killed driver is never idle
    here: recovering it is the full run's job. Takes the study lock and checks the folder
    first (:func:`~rayspec.tune._agree.prepare_folder`), as :func:`run_study` does.

    Raises:
        ConfigError: another driver holds the study, or its journal and trial files disagree.
    """
    if not os.path.isdir(cfg.out_dir):  # a new study: nothing to read, and nothing written
        return ""
    with study_lock(cfg.out_dir, printer):
        store = ParquetTrialStore(cfg.out_dir, [sc.name for sc in cfg.scenarios()[1:]])
        prepare_folder(cfg, store, printer)
        url = cfg.storage_url
        if "://" not in url and not os.path.exists(url):
            return ""
        if not os.path.isdir(os.path.join(cfg.out_dir, "trials")):
            return ""
        handle = open_study(cfg, SearchSpace.from_config(cfg.search))
        if handle.running():
            return ""
        records = store.load_records(candidate_reader(handle.space))
        return _Budget(cfg, records, len(handle.finished())).why_not(0)


def run_study(
    cfg: ExperimentConfig,
    *,
    printer: Printer = print,
    slots: int | Callable[[], int] = 1,
    trial_fn: Callable[..., TrialResult] = run_trial,
    screen: BaseNcclScreen | None = None,
    write_report: bool = False,
    progress: PlainProgress | None = None,
) -> StudyOutcome:
    """Create or resume the study and run it until its budget is spent or it has its answer.

    Args:
        cfg: the experiment.
        printer: receives the progress lines.
        slots: trials that may run at once, or a function that says how many fit now (on a
            Ray cluster whose nodes come and go: :meth:`ClusterHandle.room`); asked before
            each launch and every few seconds while trials run. Each running trial has its
            own slot number (its port is ``server.port`` + slot), so ports never collide.
        trial_fn: runs one trial (the real one starts servers through Ray actors; the search
            benchmark passes a simulated one).
        screen: the NCCL screen to use instead of the engine's own.
        write_report: write ``<out>/report.md`` and its plots at the end (``python -m
            rayspec.tune`` does; a failure is one warning line, never the study's).
        progress: shows phases, runs and the pick (default: plain lines through ``printer``;
            the CLI passes a live display on a terminal).
    """
    with study_lock(cfg.out_dir, printer):
        return _run_study(
            cfg, printer=printer, slots=slots, trial_fn=trial_fn, screen=screen,
            write_report=write_report, progress=progress,
        )  # fmt: skip


def _run_study(
    cfg: ExperimentConfig,
    *,
    printer: Printer,
    slots: int | Callable[[], int],
    trial_fn: Callable[..., TrialResult],
    screen: BaseNcclScreen | None,
    write_report: bool,
    progress: PlainProgress | None,
) -> StudyOutcome:
    """:func:`run_study` with the study lock held."""
    t0 = time.monotonic()
    space = SearchSpace.from_config(cfg.search)
    store = ParquetTrialStore(cfg.out_dir, [sc.name for sc in cfg.scenarios()[1:]])
    prepare_folder(cfg, store, printer)  # before the study is opened (which may write to it)
    handle = open_study(cfg, space)
    save_space(cfg.out_dir, space)  # the report reads the stored parameters through it
    _recover(handle, store, printer)
    read = candidate_reader(space)
    records = store.load_records(read)
    roles = handle.roles()
    done_before = len(handle.finished())
    budget = _Budget(cfg, records, done_before)
    if done_before:
        printer(
            f"resuming study {cfg.study.name}: {plural(done_before, 'trial')} done, "
            f"{budget.restarts} of {plural(budget.max_restarts, 'restart')} used"
        )
    idle = budget.why_not(0)
    if idle:
        # Nothing may start: no screen, no Ray; the report as it stands.
        final = build_report(
            records, roles, start_noise=cfg.study.start_noise, margin=cfg.study.pick_margin,
            equivalent=load_equivalence(cfg.out_dir)
            if cfg.study.sampler is Sampler.structured else None,
        )  # fmt: skip
        if write_report:  # from this experiment, as best.sh is (a changed port reaches both)
            _write_report(cfg, printer)
        return StudyOutcome(
            final, 0, done_before, time.monotonic() - t0, restarts=budget.restarts, stopped=idle
        )
    strategy: StructuredSearch | None = None
    if cfg.study.sampler is Sampler.structured:
        report = run_screen(cfg, space, printer, screen)
        strategy = StructuredSearch(
            space, report, token_bytes=token_bytes(cfg) if report else 1,
            concurrency=cfg.scenarios()[0].concurrency, start_noise=cfg.study.start_noise,
        )  # fmt: skip
    observations: list[Observation] = observations_from_records(records, roles)
    kept = list(records)  # every row, this invocation's appended as they are written
    gate = _make_gate(cfg, store, roles, records, printer)
    sink = progress if progress is not None else PlainProgress(printer)
    show = _Progress(budget.max_restarts, budget.restarts, sink)
    equivalent = strategy.equivalent if strategy is not None else None
    show.set_pick(*_pick_line(records, roles, cfg, equivalent))  # a resume's best, from the start
    ledger = _load_ledger(cfg, records, roles)
    study_metrics = StudyMetrics(cfg.study.name, cfg.study.max_restarts, records)  # Ray's metrics
    record_exporter(cfg.out_dir, cfg.study.name)  # for python -m rayspec.metrics
    scenario = objective_scenario(cfg)
    live: dict[int, TrialHandle] = {}  # trial number -> trial, for intermediate values
    evidence_at_start: dict[int, Evidence] = {}
    protected: set[int] = set()  # the baseline and enqueued references are measured in full
    # With several loads the structured search's no-speculation point is measured in full too.
    offs_in_full = strategy is not None and len({sc.concurrency for sc in cfg.scenarios()}) > 1
    extended: set[int] = set()  # trials measuring past bench.repeats (close to the best)
    ran = pruned = 0
    saved_s = 0.0
    stopped = ""

    def on_runs(number: int, runs: Sequence[float]) -> RunDecision:
        """After each run: judge it, and show how many runs are done of how many planned."""
        decision = judge_runs(number, runs)
        if decision is RunDecision.EXTEND:
            extended.add(number)
        planned = cfg.max_repeats if number in extended else cfg.bench.repeats
        sink.runs(number, len(runs), max(planned, len(runs)))
        return decision

    def judge_runs(number: int, runs: Sequence[float]) -> RunDecision:
        """After each run: report the running mean; prune a trial that cannot win; extend one
        close to the best."""
        trial = live.get(number)
        if trial is not None:
            trial.report(float(sum(runs) / len(runs)), step=len(runs))
        evidence = evidence_at_start.get(number)
        if (
            cfg.study.pruning
            and number not in protected
            and (trial is None or trial.repeat_of is None)
        ):
            incumbent = ledger.incumbent()
            between = evidence.noise.between if evidence is not None else cfg.study.start_noise
            if incumbent is not None and cannot_beat(
                runs, incumbent.runs, min_runs=cfg.study.prune_min_runs, between=between
            ):
                return RunDecision.PRUNE
        if (
            evidence is not None
            and trial is not None
            and len(runs) >= cfg.bench.repeats
            and cfg.max_repeats > cfg.bench.repeats
            and wants_more_runs(
                runs,
                evidence.points,
                evidence.noise,
                key=evidence.key_of(trial.candidate),
                floor=bool(trial.role),
            )  # fmt: skip
        ):
            return RunDecision.EXTEND
        return RunDecision.CONTINUE

    def record(trial: TrialHandle, result: TrialResult, reused_from: int | None) -> None:
        nonlocal ran, pruned, saved_s
        runs = [v for v in per_run_tok_s(result.requests, scenario).values() if math.isfinite(v)]
        if result.state in (TrialState.COMPLETE, TrialState.PRUNED) and runs:
            metrics = dict(result.metrics) | ledger.comparisons(runs)
            result = dataclasses.replace(result, metrics=metrics)
        result = _check_output(gate, trial, result, printer)
        alarm = ""
        if result.state is TrialState.COMPLETE and result.launch is not None:
            alarm = acceptance_alarm(
                result.candidate, float(result.metrics.get("accept_length", math.nan)),
                _chains(observations), expected=cfg.study.expect_accept_length,
            )  # fmt: skip
        if result.costs_restart:  # a launch lost with its node is not: its retry counts
            budget.restarts += 1
        stored = _record(trial, result, runs, budget.restarts, alarm)
        handle.keep_record(trial, stored)  # the journal first, then the row, then tell
        store.append_trial(stored)
        handle.tell(trial, result)
        study_metrics.trial_done(result, budget.restarts)
        budget.told += 1
        observations.extend(observations_from_records([stored], {}))
        if result.state is TrialState.COMPLETE and runs and result.launch is not None:
            ledger.add(Measured(result.trial, result.candidate, tuple(runs)))
        if result.state is TrialState.PRUNED:
            pruned += 1
            saved_s += float(result.metrics.get("bench_s_saved", 0.0))
        live.pop(result.trial, None)
        evidence_at_start.pop(result.trial, None)
        ran += 1
        extended.discard(result.trial)
        # From the rows in memory: reading every row back after each trial (as the final
        # report does) grows with the study and holds up the freed slot's next launch.
        kept.append(stored)
        show.set_pick(*_pick_line(kept, handle.roles(), cfg, equivalent))
        sink.trial_finished(result.trial)
        show.finished(result, trial, reused_from)
        if alarm:
            printer(f"  acceptance alarm: {alarm}")

    def next_trial(pending: Sequence[Candidate]) -> TrialHandle | None:
        nonlocal stopped
        if handle.queued():
            return handle.ask()
        if strategy is None:
            if handle.exhausted():
                stopped = "every configuration of the grid was tried"
                return None
            if handle.grid_waits():  # only running points left: wait for one to finish
                return None
            return handle.ask()
        proposal = strategy.propose(observations, pending)
        if proposal is None:
            if not pending:
                stopped = "converged: no configuration left that could beat the pick"
            return None
        return handle.ask(proposal.candidate, reason=proposal.reason, repeat_of=proposal.repeat_of)

    pending: dict[cf.Future[TrialResult], tuple[TrialHandle, int]] = {}
    room = _Room(slots)
    held = HeldTrials()  # asked while their configuration runs in another slot
    unstarted: list[TrialHandle] = []  # held, then left to start when no launch may
    # No new trial starts: the sampler keeps proposing what was tried, or no room could be had.
    halted = False
    instant_in_a_row = 0
    with cf.ThreadPoolExecutor(max_workers=room.max_workers, thread_name_prefix="trial") as pool:
        try:
            while True:
                holds = 0
                while room.free(len(pending)):
                    trial = held.next_ready()
                    fresh = trial is None
                    if trial is None:
                        why = budget.why_not(len(pending), len(held))
                        if why or halted:
                            stopped = stopped or why
                            break
                        trial = next_trial([t.candidate for t, _ in pending.values()])
                        if trial is None:
                            break
                    running = {canonical_key(t.candidate): t.number for t, _ in pending.values()}
                    twin = running.get(canonical_key(trial.candidate))
                    if twin is not None:  # never one configuration twice at once
                        held.hold(trial, twin)
                        holds += 1
                        if holds >= _MAX_HOLDS_PER_ROUND:
                            break  # the sampler draws only what runs: wait for a trial to end
                        continue
                    if trial.role or (offs_in_full and trial.candidate.spec is None):
                        # References are measured in full, and so is no speculation with
                        # several loads: pruned on the first, it would leave the others without
                        # the point the adaptive tiers need (0 steps where speculation loses).
                        protected.add(trial.number)
                        if trial.role == "baseline":
                            ledger.baseline = trial.number
                    instant, reused_from = _instant_result(handle, trial, observations)
                    if instant is not None:
                        record(trial, instant, reused_from)
                        instant_in_a_row += 1
                        if instant_in_a_row >= _MAX_INSTANT_IN_A_ROW:
                            stopped = "the sampler keeps proposing configurations already tried"
                            halted = True
                        continue
                    if not fresh and (halted or budget.why_not(len(pending))):
                        unstarted.append(trial)  # its twin left nothing to reuse, no launch left
                        continue
                    instant_in_a_row = 0
                    slot = room.take()
                    live[trial.number] = trial
                    evidence_at_start[trial.number] = weigh(
                        observations, start_noise=cfg.study.start_noise, equivalent=equivalent
                    )
                    sink.trial_started(trial.number, trial.candidate.label())
                    future = pool.submit(
                        trial_fn, cfg, trial.number, trial.candidate, slot=slot,
                        on_phase=show.phase, on_runs=on_runs,
                    )  # fmt: skip
                    pending[future] = (trial, slot)
                if not pending:
                    if stopped or halted or not room.dynamic:
                        break
                    if not room.wait_for_room():  # every usable node is gone
                        stopped = room.none_left
                        break
                    continue
                finished, _ = cf.wait(
                    pending, timeout=room.poll_s, return_when=cf.FIRST_COMPLETED
                )  # a node that joins meanwhile is used without waiting for a trial to end
                for future in finished:
                    trial, slot = pending.pop(future)
                    room.give_back(slot)
                    result = future.result()
                    held_outside = _halts_study(cfg, trial.number, result)
                    if held_outside:
                        # Held outside the study (GPUs, a port): every later trial would meet
                        # it too. Stop starting trials; a resume runs this one first.
                        handle.requeue(trial)
                        halted = True
                        stopped = held_outside
                        printer(f"trial {trial.number}: {result.failure_detail}")
                    if result.failure in (FailureReason.NODE_LOST, FailureReason.ACTOR_LOST):
                        # Queued before the row is written: a driver killed in between leaves
                        # a RUNNING trial whose retry exists (recovery does not queue another).
                        again = handle.retry_elsewhere(trial)
                        what = ("its node died" if result.failure == FailureReason.NODE_LOST
                                else "its server actor's worker died")  # fmt: skip
                        printer(
                            f"trial {trial.number}: {what} ({result.node}); "
                            + ("queued again for another node" if again
                               else "not queued again (it was the retry of a lost trial)")
                        )  # fmt: skip
                    record(trial, result, None)
                    held.release(trial.number)
            for trial in [*unstarted, *held.drain()]:
                # Held, and its twin left no result to reuse when no launch may start: tried
                # again on resume, as a trial the driver stopped.
                instant, reused_from = _instant_result(handle, trial, observations)
                if instant is None:
                    handle.requeue(trial)
                    instant = failed_result(
                        trial.number, trial.candidate, FailureReason.INTERRUPTED,
                        f"the study stopped ({stopped or 'no room'}) before this trial, held "
                        "while the same configuration ran in another slot, could start; its "
                        "configuration was queued again",
                    )  # fmt: skip
                record(trial, instant, reused_from)
        except BaseException:
            # Ctrl-C, SIGTERM or a bug: stop every running server now rather than letting the
            # pool wait for trials to finish; their trials stay RUNNING and are retried on resume.
            for future in pending:
                future.cancel()
            LIVE_ACTORS.kill_all()
            raise
    final = build_report(
        store.load_records(read),
        handle.roles(),
        start_noise=cfg.study.start_noise,
        margin=cfg.study.pick_margin,
        equivalent=equivalent,
    )
    if write_report:
        _write_report(cfg, printer)
    return StudyOutcome(
        final, ran, done_before, time.monotonic() - t0, pruned, saved_s, budget.restarts,
        stopped,
    )  # fmt: skip


def _write_report(cfg: ExperimentConfig, printer: Printer) -> None:
    """``report.md`` and its plots; a failure is one warning line, never the study's."""
    try:
        from rayspec.report import write_report

        printer(write_report(cfg.out_dir, cfg).describe())
    except Exception as exc:  # noqa: BLE001 - the trials are stored; only the report failed
        printer(f"warning: report not written ({type(exc).__name__}: {exc}); "
                f"try: python -m rayspec.report {cfg.out_dir}")  # fmt: skip


def _make_gate(
    cfg: ExperimentConfig,
    store: ParquetTrialStore,
    roles: dict[int, str],
    records: Sequence[TrialRecord],
    printer: Printer,
) -> OutputGate:
    """The correctness gate, with the baseline's outputs when a resumed study has them."""
    scenarios = {sc.name: sc for sc in bench_plan(cfg).scenarios}

    @functools.lru_cache(maxsize=4096)
    def key_of(scenario: str, run: int, index: int) -> str:
        ask = request_input(scenarios[scenario], run, index)
        return prompt_key(ask.prompt, ask.max_tokens)

    gate = OutputGate(key_of, gate_tokens=cfg.bench.gate_tokens, enabled=cfg.bench.check_outputs)
    measured = {
        r.trial for r in records
        if r.result.state is TrialState.COMPLETE and r.run_values and not r.reused
    }  # fmt: skip
    # The latest measured baseline start (an interrupted one's retry holds the baseline role).
    baseline = max((n for n, r in roles.items() if r == "baseline" and n in measured),
                   default=None)  # fmt: skip
    if gate.enabled and baseline is not None:
        table = store.load_requests()
        rows = [r for r in table.to_pylist() if int(r["trial"]) == baseline]
        ok = [request_record(r) for r in rows if r["scenario"] in scenarios]
        gate.set_reference(baseline, ok)
        if not gate.reference:
            printer(f"correctness gate: the baseline's (trial {baseline}) outputs are not in "
                    f"{store.requests_dir}: later trials cannot be compared and will not be "
                    "picked; restore that file or start a new study")  # fmt: skip
    return gate


def _check_output(
    gate: OutputGate, trial: TrialHandle, result: TrialResult, printer: Printer
) -> TrialResult:
    """The correctness gate on a measured trial: the baseline sets the reference, its second
    start checks the engine's drift, every other trial is compared (wrong_output fails it)."""
    if result.state not in (TrialState.COMPLETE, TrialState.PRUNED) or not result.requests:
        return result
    if trial.role == "baseline":
        gate.set_reference(result.trial, result.requests)
        return result
    if trial.role == ROLE_BASELINE_AGAIN:
        line = gate.check_drift(result.requests)
        if line:
            printer(f"correctness gate: {line}")
        return result
    verdict = gate.judge(result.requests)
    if verdict is None:
        if not gate.enabled:  # bench.check_outputs=false, or turned off (said when it was)
            return result
        # On, with nothing to compare against: said in the row and the progress, and never
        # picked (build_report), rather than passing as if checked.
        why = gate.unchecked_reason()
        printer(f"correctness gate: trial {result.trial}'s outputs were not compared ({why}); "
                "it will not be picked")  # fmt: skip
        return dataclasses.replace(
            result,
            metrics=dict(result.metrics) | {GATE_UNCHECKED: 1.0},
            failure_detail=f"outputs not compared by the correctness gate: {why}",
        )
    metrics = dict(result.metrics)
    metrics["gate_compared"] = float(verdict.compared)
    metrics["gate_diverged_early"] = float(verdict.diverged_early)
    if not verdict.wrong:
        return dataclasses.replace(result, metrics=metrics)
    assert gate.reference_trial is not None
    return dataclasses.replace(
        result,
        state=TrialState.FAIL,
        value=None,
        metrics=metrics,
        failure=FailureReason.WRONG_OUTPUT,
        failure_detail=verdict.describe(gate.gate_tokens, gate.reference_trial),
    )


def _chains(observations: Sequence[Observation]) -> list[Chain]:
    """The measured chain trials (topk 1), for the acceptance alarm."""
    out = []
    for o in observations:
        spec = o.candidate.spec
        if o.measured and spec is not None and spec.eagle_topk == 1 and o.runs:
            out.append(Chain(o.trial, spec.num_steps, o.accept_length, sum(o.runs) / len(o.runs)))
    return out


def _pick_line(
    records: Sequence[TrialRecord],
    roles: dict[int, str],
    cfg: ExperimentConfig,
    equivalent: Equivalence | None,
) -> tuple[str, PickView | None]:
    """``pick 99.1 tok/s (trial 7+12), +57 % vs baseline`` for the progress lines, and the
    same as data for a live display."""
    if not records:
        return "no pick yet", None
    report = build_report(records, roles, start_noise=cfg.study.start_noise, equivalent=equivalent,
                          margin=cfg.study.pick_margin)  # fmt: skip
    best = report.best
    if best is None:
        return "no pick yet", None
    gain = None
    if report.baseline is not None and report.baseline.trials != best.trials:
        gain = best.tok_s_mean / report.baseline.tok_s_mean - 1
    view = PickView(best.tok_s_mean, best.trials, gain)
    return f"pick {view.describe()}", view


def _nccl_cause(
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


def _instant_result(
    handle: StudyHandle, trial: TrialHandle, observations: Sequence[Observation]
) -> tuple[TrialResult | None, int | None]:
    """Results that need no server, and the trial whose result is reused (if any).

    An impossible draft tree, an NCCL set that already failed a launch, a configuration that
    already failed, or (without ``repeat_of``) one measured before.
    """
    candidate = trial.candidate
    spec = candidate.spec
    if spec is not None and not spec.fits_tree:
        return failed_result(
            trial.number,
            candidate,
            FailureReason.INFEASIBLE,
            f"num_draft_tokens {spec.num_draft_tokens} - 1 exceeds the draft tree's "
            f"{spec.tree_capacity} nodes (topk {spec.eagle_topk}, "
            f"{plural(spec.num_steps, 'step')}): "
            "SGLang would fail at the first decode, so it was not launched",
        ), None
    if trial.retry_of is not None:
        return None, None  # an interrupted trial is tried again as it was
    cause = _nccl_cause(observations, candidate)
    if cause is not None:
        failed_trial, reason, what = cause
        return failed_result(
            trial.number, candidate, FailureReason(reason),
            f"{what} failed the launch of trial {failed_trial} ({reason}): not launched again",
        ), None  # fmt: skip
    key = canonical_key(candidate)
    failed = handle.failed_by_key().get(key)
    if failed is not None and failed.number != trial.number:
        reason = str(failed.attrs.get("failure_reason", "unknown"))
        trial.set_attr("reused_from", failed.number)
        return failed_result(
            trial.number, candidate, FailureReason(reason),
            f"same configuration as trial {failed.number}, which failed ({reason}): not "
            "launched again",
        ), failed.number  # fmt: skip
    if trial.repeat_of is not None or trial.role == ROLE_BASELINE_AGAIN:
        return None, None  # a deliberate new server start
    previous = handle.completed_by_key().get(key)
    if previous is not None and previous.number != trial.number:
        trial.set_attr("reused_from", previous.number)
        now = time.time()
        metrics = {
            k: float(v)
            for k, v in previous.attrs.items()
            if k in ("tok_s_mean", "tok_s_peak", "tok_s_std", "accept_length")
        }
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
