"""The study loop: screen NCCL, ask the strategy for the next configuration, run it on a free
slot, store every result, tell Optuna, until the restart budget is spent or the search is done.

The budget is counted in server launches (``study.max_restarts``): a result reused from an
identical configuration, or one refused before launch, costs none (``_reuse``). Queued
configurations (the baseline, ``study.enqueue``, retries) go first; then the study's
:class:`~rayspec.search.Strategy` (built by ``_strategy``: the structured search or Optuna's
sampler) chooses, and the Optuna study stays the record (optuna-dashboard shows every trial).

Around the loop, one module per job: recovery after a killed driver (``_recovery``), the
budget (``_budget``), slots (``_room``), the run-by-run judge (``_runs``), recording a trial
(``_recorder``), the correctness gate (``_gate``), the pick line (``_pick``), progress lines.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import time
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass

from rayspec._config import ExperimentConfig
from rayspec._exceptions import RayspecError
from rayspec._plural import plural
from rayspec._types import Candidate
from rayspec._types import TrialResult
from rayspec.results import StudyReport
from rayspec.results import believes
from rayspec.results import build_report
from rayspec.results import candidate_reader
from rayspec.results import observations_from_records
from rayspec.results import save_space
from rayspec.screen import BaseNcclScreen
from rayspec.search import Observation
from rayspec.search import SearchSpace
from rayspec.search import Strategy
from rayspec.search import TrialHandle
from rayspec.search import Wait
from rayspec.search import canonical_key
from rayspec.search import open_study
from rayspec.search import weigh
from rayspec.store import ParquetTrialStore
from rayspec.store import StudyFolder
from rayspec.tune._agree import prepare_folder
from rayspec.tune._budget import Budget
from rayspec.tune._budget import halts_study
from rayspec.tune._gate import awaits_reference
from rayspec.tune._gate import make_gate
from rayspec.tune._halt import SameStartupFailure
from rayspec.tune._held import HeldTrials
from rayspec.tune._ledger import load_ledger
from rayspec.tune._lock import study_lock
from rayspec.tune._metrics import StudyMetrics
from rayspec.tune._metrics import record_exporter
from rayspec.tune._pick import pick_line
from rayspec.tune._progress import PlainProgress
from rayspec.tune._progress import TrialLines
from rayspec.tune._recorder import Recorder
from rayspec.tune._recovery import recover
from rayspec.tune._recovery import retry_lost
from rayspec.tune._recovery import set_aside_trials
from rayspec.tune._reuse import held_result
from rayspec.tune._reuse import instant_result
from rayspec.tune._room import Room
from rayspec.tune._runs import RunJudge
from rayspec.tune._strategy import make_strategy
from rayspec.tune._strategy import stored_equivalence
from rayspec.tune._trial import LIVE_ACTORS
from rayspec.tune._trial import run_trial
from rayspec.tune._verify import plan_reserve
from rayspec.tune._verify import verify_plan

__all__ = ["StudyOutcome", "idle_reason", "run_study"]

Printer = Callable[[str], None]
# A sampler that keeps proposing measured configurations (reused at no cost) is stopped after
# this many such trials in a row.
_MAX_INSTANT_IN_A_ROW = 200
# Draws of running configurations in one round of filling slots before the driver waits for a
# trial to end (each is an Optuna trial that ends as a reuse: a small space must not fill the
# study with them).
_MAX_HOLDS_PER_ROUND = 4
# The study attribute that holds the budget a study had when its search stopped by itself.
_CONVERGED_BUDGET = "converged_with_budget"
_CONVERGED_USED = "converged_after_restarts"


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
    # The study cannot go on as it is (``stopped`` says why): the CLI exits 1. The same startup
    # failure twice in a row, or a search asking for a start that cannot happen.
    stuck: bool = False


def _store(cfg: ExperimentConfig) -> ParquetTrialStore:
    return ParquetTrialStore(cfg.out_dir, [sc.name for sc in cfg.scenarios()[1:]])


def idle_reason(
    cfg: ExperimentConfig, printer: Printer = print, *, space: SearchSpace | None = None
) -> str:
    """Why a stored study has nothing left to run ("" when it has, or when it is new).

    Read from the study folder alone (Optuna storage and Parquet), so the CLI can say so
    without starting Ray. A study with a trial left running by a killed driver is never idle
    here: recovering it is the full run's job. Takes the study lock and checks the folder
    first (:func:`~rayspec.tune._agree.prepare_folder`), as :func:`run_study` does.
    ``space``: the experiment's space when the caller has built it.

    Raises:
        ConfigError: another driver holds the study, or its journal and trial files disagree.
    """
    if not os.path.isdir(cfg.out_dir):  # a new study: nothing to read, and nothing written
        return ""
    with study_lock(cfg.out_dir, printer):
        store = _store(cfg)
        space = space or SearchSpace.from_config(cfg.search)
        prepare_folder(cfg, store, printer, space)
        url = cfg.storage_url
        if "://" not in url and not os.path.exists(url):
            return ""
        if not os.path.isdir(StudyFolder(cfg.out_dir).trials):
            return ""
        handle = open_study(cfg, space)
        if handle.running():
            return ""
        records = store.load_records(candidate_reader(handle.space))
        return Budget(cfg, records, len(handle.finished())).why_not(0)


def run_study(
    cfg: ExperimentConfig,
    *,
    printer: Printer = print,
    slots: int | Callable[[], int] = 1,
    trial_fn: Callable[..., TrialResult] = run_trial,
    screen: BaseNcclScreen | None = None,
    write_report: bool = False,
    progress: PlainProgress | None = None,
    space: SearchSpace | None = None,
    strategy: Strategy | None = None,
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
        space: the experiment's search space when the caller has built it (else built here).
        strategy: chooses the configurations (default: the one ``study.sampler`` names).
    """
    from rayspec.tune._ports import with_free_ports

    cfg, notes = with_free_ports(cfg)  # port 0: a free one (the CLI has chosen it already)
    for note in notes:
        printer(note)
    with study_lock(cfg.out_dir, printer):
        return _run_study(
            cfg, space or SearchSpace.from_config(cfg.search), printer=printer, slots=slots,
            trial_fn=trial_fn, screen=screen, write_report=write_report, progress=progress,
            strategy=strategy,
        )  # fmt: skip


def _run_study(
    cfg: ExperimentConfig,
    space: SearchSpace,
    *,
    printer: Printer,
    slots: int | Callable[[], int],
    trial_fn: Callable[..., TrialResult],
    screen: BaseNcclScreen | None,
    write_report: bool,
    progress: PlainProgress | None,
    strategy: Strategy | None,
) -> StudyOutcome:
    """:func:`run_study` with the study lock held."""
    t0 = time.monotonic()
    store = _store(cfg)
    prepare_folder(cfg, store, printer, space)  # before the study is opened (it may write)
    handle = open_study(cfg, space)
    save_space(cfg.out_dir, space)  # the report reads the stored parameters through it
    aside = recover(handle, store, printer)  # measured, awaiting the baseline: recorded below
    read = candidate_reader(space)
    records = [r for r in store.load_records(read) if r.trial not in aside]
    roles = handle.roles()
    done_before = len(handle.finished())
    budget = Budget(cfg, records, done_before)
    if done_before:
        printer(
            f"resuming study {cfg.study.name}: {plural(done_before, 'trial')} done, "
            f"{budget.restarts} of {plural(budget.max_restarts, 'restart')} used"
        )
    idle = budget.why_not(0)  # the whole budget: the plan's verification may still be due
    budget.reserved = plan_reserve(cfg, records)  # the search's share ends this much earlier
    if idle:
        # Nothing may start: no screen, no Ray; the report as it stands.
        final = build_report(
            records, roles, start_noise=cfg.study.start_noise, margin=cfg.study.pick_margin,
            equivalent=stored_equivalence(cfg), belief=believes(cfg),
        )  # fmt: skip
        if write_report:  # from this experiment, as best.sh is (a changed port reaches both)
            _write_report(cfg, printer)
        return StudyOutcome(
            final, 0, done_before, time.monotonic() - t0, restarts=budget.restarts, stopped=idle
        )
    if strategy is None:
        strategy = make_strategy(cfg, space, printer, screen)
    attrs = handle.study_attrs()
    then, used = attrs.get(_CONVERGED_BUDGET), attrs.get(_CONVERGED_USED)
    if isinstance(then, int) and isinstance(used, int) and cfg.study.max_restarts > then:
        added = cfg.study.max_restarts - then
        strategy.extend(used + added)
        printer(
            f"the study had stopped by itself after {plural(used, 'restart')} of {then}: the "
            f"{added} added are spent where they are worth most"
        )
    equivalent = strategy.equivalent
    observations: list[Observation] = observations_from_records(records, roles)
    gate = make_gate(cfg, store, roles, records, printer)
    sink = progress if progress is not None else PlainProgress(printer)
    lines = TrialLines(budget.max_restarts, budget.restarts, sink)
    lines.set_pick(*pick_line(records, roles, cfg, equivalent))  # a resume's best, from the start
    ledger = load_ledger(cfg.study.alpha, records, roles)
    judge = RunJudge(cfg, ledger, sink)
    metrics = StudyMetrics(cfg.study.name, cfg.study.max_restarts, records)  # Ray's metrics
    record = Recorder(cfg, handle, store, gate, ledger, budget, judge, lines, metrics, printer,
                      observations, list(records), equivalent)  # fmt: skip
    record_exporter(cfg.out_dir, cfg.study.name)  # for python -m rayspec.metrics
    stopped = ""

    def next_trial(running: list[Candidate]) -> TrialHandle | None:
        nonlocal stopped
        if handle.queued():  # the baseline, study.enqueue, retries: before the strategy
            return handle.ask()
        answer = strategy.ask(handle, observations, running)
        if isinstance(answer, Wait):
            stopped = answer.done or stopped
            return None
        return answer

    pending: dict[cf.Future[TrialResult], tuple[TrialHandle, int]] = {}
    # Finished before the baseline, whose outputs the gate compares them with: recorded once
    # the baseline is (awaits_reference); until then they count as running. A stopped
    # driver's such trials are recorded at once when the gate has its reference now.
    awaiting = set_aside_trials(handle, store, aside)
    if awaiting and (gate.reference or not gate.enabled):
        for waited, measured in awaiting:
            record(waited, measured, None)
        awaiting = []
    room = Room(slots)
    held = HeldTrials()  # asked while their configuration runs in another slot
    unstarted: list[TrialHandle] = []  # held, then left to start when no launch may
    # No new trial starts: the sampler keeps proposing what was tried, or no room could be had.
    halted = False
    stuck = False
    instant_in_a_row = 0
    startups = SameStartupFailure(StudyFolder(cfg.out_dir).logs)
    with cf.ThreadPoolExecutor(max_workers=room.max_workers, thread_name_prefix="trial") as pool:
        try:
            while True:
                holds = 0
                while room.free(len(pending)):
                    trial = held.next_ready()
                    fresh = trial is None
                    if trial is None:
                        why = budget.why_not(len(pending) + len(awaiting), len(held))
                        if why or halted:
                            stopped = stopped or why
                            break
                        trial = next_trial([t.candidate for t in _in_flight(pending, awaiting)])
                        if trial is None:
                            break
                    running = {
                        canonical_key(t.candidate): t.number for t in _in_flight(pending, awaiting)
                    }
                    twin = running.get(canonical_key(trial.candidate))
                    if twin is not None:  # never one configuration twice at once
                        held.hold(trial, twin)
                        holds += 1
                        if holds >= _MAX_HOLDS_PER_ROUND:
                            break  # the sampler draws only what runs: wait for a trial to end
                        continue
                    if trial.role or strategy.measured_in_full(trial.candidate):
                        judge.in_full(trial.number)  # the references, and what the strategy says
                        if trial.role == "baseline":
                            ledger.baseline = trial.number
                    instant, reused_from = instant_result(handle, trial, observations)
                    if instant is not None:
                        record(trial, instant, reused_from)
                        instant_in_a_row += 1
                        if fresh and trial.repeat_of is not None and trial.retry_of is None:
                            # Asked for a new start that cannot happen: the same observations
                            # would ask for it again and again.
                            stopped = (
                                f"the search asked for another start of trial "
                                f"{trial.repeat_of}'s configuration, which cannot start "
                                f"({instant.failure_detail})"
                            )
                            halted = stuck = True
                        elif instant_in_a_row >= _MAX_INSTANT_IN_A_ROW:
                            stopped = "the sampler keeps proposing configurations already tried"
                            halted = True
                        continue
                    if not fresh and (halted or budget.why_not(len(pending) + len(awaiting))):
                        unstarted.append(trial)  # its twin left nothing to reuse, no launch left
                        continue
                    instant_in_a_row = 0
                    slot = room.take()
                    judge.started(trial, weigh(
                        observations, start_noise=cfg.study.start_noise, equivalent=equivalent
                    ))  # fmt: skip
                    sink.trial_started(trial.number, trial.candidate.label())
                    future = pool.submit(
                        trial_fn, cfg, trial.number, trial.candidate, slot=slot,
                        on_phase=lines.phase, on_runs=judge.on_runs,
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
                done: list[tuple[TrialHandle, TrialResult]] = []
                for future in finished:
                    trial, slot = pending.pop(future)
                    room.give_back(slot)
                    done.append((trial, future.result()))
                done.sort(key=lambda d: d[0].role != "baseline")  # its outputs: the reference
                if any(t.role == "baseline" for t, _ in pending.values()):
                    waits = [awaits_reference(gate, *d) for d in done]
                    awaiting += [d for d, w in zip(done, waits, strict=True) if w]
                    done = [d for d, w in zip(done, waits, strict=True) if not w]
                else:
                    done, awaiting = [*done, *awaiting], []
                for trial, result in done:
                    held_outside = halts_study(cfg, trial.number, result)
                    if held_outside:
                        # Held outside the study (GPUs, a port): every later trial would meet
                        # it too. Stop starting trials; a resume runs this one first.
                        handle.requeue(trial)
                        halted = True
                        stopped = held_outside
                        printer(f"trial {trial.number}: {result.failure_detail}")
                    retry_lost(handle, trial, result, printer)  # before its row is written
                    record(trial, result, None)
                    held.release(trial.number)
                    same = startups.see(result)
                    if same and not halted:
                        halted = stuck = True
                        stopped = same
            for trial in [*unstarted, *held.drain()]:
                record(trial, *held_result(handle, trial, observations, stopped))
            for waited, measured in awaiting:  # no baseline ran: judged without a reference
                record(waited, measured, None)
            awaiting = []
            if not halted:  # the plan's verification, on the restarts kept for it
                kept = store.load_records(read)
                searched = build_report(
                    kept, handle.roles(), start_noise=cfg.study.start_noise,
                    margin=cfg.study.pick_margin, equivalent=equivalent, belief=believes(cfg),
                )  # fmt: skip
                verify_plan(cfg, handle, searched, kept, budget, record, trial_fn, lines, printer)
        except BaseException:
            # Ctrl-C, SIGTERM or a bug: stop every running server now rather than letting the
            # pool wait for trials to finish; their trials stay RUNNING and are retried on resume.
            for future in pending:
                future.cancel()
            LIVE_ACTORS.kill_all()
            _keep_measured(record, awaiting, printer)
            raise
    final = build_report(
        store.load_records(read), handle.roles(), start_noise=cfg.study.start_noise,
        margin=cfg.study.pick_margin, equivalent=equivalent, belief=believes(cfg),
    )  # fmt: skip
    if write_report:
        _write_report(cfg, printer)
    if stopped.startswith("converged"):  # a larger budget next time is spent, not stopped on
        handle.set_study_attrs(
            {_CONVERGED_BUDGET: cfg.study.max_restarts, _CONVERGED_USED: budget.restarts}
        )
    return StudyOutcome(
        final, record.ran, done_before, time.monotonic() - t0, record.pruned, record.saved_s,
        budget.restarts, stopped, stuck,
    )  # fmt: skip


def _write_report(cfg: ExperimentConfig, printer: Printer) -> None:
    """``report.md`` and its plots; a failure is one warning line, never the study's."""
    try:
        from rayspec.report import write_report

        printer(write_report(cfg.out_dir, cfg).describe())
    except Exception as exc:  # noqa: BLE001 - the trials are stored; only the report failed
        printer(f"warning: report not written ({type(exc).__name__}: {exc}); "
                f"try: python -m rayspec.report {cfg.out_dir}")  # fmt: skip


def _keep_measured(
    record: Recorder, awaiting: Sequence[tuple[TrialHandle, TrialResult]], printer: Printer
) -> None:
    """On the way out: the trials measured while the baseline ran keep their measurement (a
    resume records them once it has the baseline's outputs, rather than measuring again)."""
    for trial, result in awaiting:
        try:
            record.set_aside(trial, result)
        except (OSError, RayspecError) as exc:  # it is measured again on resume, as before
            printer(f"trial {trial.number}: its measurement could not be kept ({exc})")


def _in_flight(
    pending: Mapping[cf.Future[TrialResult], tuple[TrialHandle, int]],
    awaiting: Sequence[tuple[TrialHandle, TrialResult]],
) -> list[TrialHandle]:
    """The trials running, and those finished but not yet recorded (awaiting the baseline)."""
    return [t for t, _ in pending.values()] + [t for t, _ in awaiting]
