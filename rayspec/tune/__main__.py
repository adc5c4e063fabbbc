"""``python -m rayspec.tune EXPERIMENT.yaml [MORE.yaml ...] [dotted.key=value ...]``: run an
experiment.

The only module that prints for the study or calls ``sys.exit``. Exit codes: 0 done, 2 bad
input (nothing started), 1 an unexpected error, no trial measured, or a study that cannot go
on as it is (the same startup failure twice in a row: one ``error:`` line says why), 130
interrupted (Ctrl-C, SIGTERM or SIGHUP, to the driver or its whole process group; run it again
to resume).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import signal
import sys
import time
from types import FrameType
from typing import TYPE_CHECKING

from rayspec._config import Engine
from rayspec._config import ExperimentConfig
from rayspec._config import Sampler
from rayspec._config import load_config
from rayspec._exceptions import ConfigError
from rayspec._exceptions import RayspecError
from rayspec._plural import plural
from rayspec._text import one_line

if TYPE_CHECKING:
    from rayspec.results import PlanVerdict
    from rayspec.results import StudyReport
    from rayspec.search import SearchSpace


def installed_command(name: str) -> str:
    """A console script installed beside this interpreter, spelled so it runs as printed
    without an activated venv: ``.venv/bin/optuna-dashboard`` (relative when under the current
    folder), or the bare name when this interpreter has no such script beside it."""
    path = os.path.join(os.path.dirname(sys.executable), name)
    if not os.path.exists(path):
        return name
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def _prog() -> str:
    """This command as the user can type it again: the running interpreter's path."""
    python = installed_command("python")
    return f"{python if os.sep in python else 'python'} -m rayspec.tune"


USAGE = (
    "{prog} [--dry-run | --print-config] EXPERIMENT.yaml [MORE.yaml ...] [dotted.key=value ...]"
)


def _parser() -> argparse.ArgumentParser:
    prog = _prog()
    p = argparse.ArgumentParser(
        prog=prog,
        usage=USAGE.format(prog=prog),
        description="Run an Optuna study over NCCL and EAGLE-3 settings with Ray actors; store\n"
        "every trial in Parquet; end with the best configuration as a launch command.",
        epilog="examples:\n"
        f"  {prog} experiments/eagle3-twin.yaml study.max_restarts=40\n"
        f"  {prog} experiments/eagle3.yaml clusters/onprem-8gpu.yaml \\\n"
        "      server.model_path=/models/target server.draft_model_path=/models/eagle3",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "experiment", nargs="?", metavar="EXPERIMENT.yaml", help="the experiment YAML file"
    )
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="MORE.yaml | dotted.key=value",
        help="more experiment files and dotted overrides, merged over the first file in order",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate, print the baseline's launch line, and exit without starting anything",
    )
    p.add_argument("--print-config", action="store_true", help="print the merged config and exit")
    return p


def _say(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)


def _error(message: str, code: int) -> int:
    # One line per problem (preflight joins several with "\nerror: "), whatever a value in
    # the message holds: a key or value is quoted back to the user as it was given.
    for problem in message.split("\nerror: "):
        print(f"error: {one_line(problem)}", file=sys.stderr, flush=True)
    return code


# What a batch system (timeout, Slurm's scancel, systemd) or a closed terminal sends; Ctrl-C's
# SIGINT is Python's KeyboardInterrupt already.
INTERRUPTS = (signal.SIGTERM, signal.SIGHUP)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    del frame
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.experiment is None:
        parser.print_usage(sys.stderr)
        return _error(
            "no experiment file given: name one, e.g. experiments/eagle3-twin.yaml "
            "(--help explains the rest)",
            2,
        )
    try:
        cfg = load_config(args.experiment, args.overrides)
        from rayspec.search import SearchSpace
        from rayspec.tune._preflight import preflight

        space = SearchSpace.from_config(cfg.search)  # once: preflight, the dry run and the study

        launching = not (args.dry_run or args.print_config)
        if not args.print_config:  # port 0: a free one, before preflight checks it
            from rayspec.tune._ports import with_free_ports

            cfg, notes = with_free_ports(cfg)
            for note in notes:
                _say(note)
        if launching:  # a second driver on this study: said before preflight's port checks
            from rayspec.tune._lock import check_unlocked
            from rayspec.tune._preflight import check_path_limits

            check_path_limits(cfg)  # a path the system refuses: before the lock is looked at

            check_unlocked(cfg.out_dir)
        warnings = preflight(cfg, launching=launching, space=space)
    except ConfigError as exc:
        return _error(str(exc), 2)
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr, flush=True)
    if args.print_config:
        # The storage as the study will use it (the schema's "" means "<out>/optuna.journal").
        study = dataclasses.replace(cfg.study, storage=cfg.storage_url)
        print(dataclasses.replace(cfg, study=study).to_yaml(), end="")
        return 0
    if args.dry_run:
        return _dry_run(cfg, space)
    for signum in INTERRUPTS:  # stop the servers and exit 130, as Ctrl-C does
        signal.signal(signum, _raise_interrupt)
    try:
        return _run(cfg, space)
    except KeyboardInterrupt:
        _say("interrupted: servers stopped; run the same command again to resume the study")
        return 130
    except ConfigError as exc:
        return _error(str(exc), 2)
    except RayspecError as exc:
        return _error(str(exc), 1)
    except OSError as exc:  # a full disk, a folder gone: the study resumes once it is fixed
        return _error(f"{exc}; fix that, then run the same command again to resume", 1)


def _dry_run(cfg: ExperimentConfig, space: SearchSpace) -> int:
    from rayspec.server._command import build_launch
    from rayspec.server._command import shell_line

    launch = build_launch(cfg, space.baseline(), port=cfg.server.port, log_path="-")
    print(
        f"study {cfg.study.name}: {space.size()} distinct candidates, a budget of "
        f"{cfg.study.max_restarts} server restarts ({cfg.study.sampler.value} search)"
    )
    print(f"baseline: {shell_line(launch)}")
    for i, params in enumerate(cfg.study.enqueue):
        cand = space.candidate(space.coerce(params))
        line = shell_line(build_launch(cfg, cand, port=cfg.server.port, log_path="-"))
        print(f"enqueued[{i}]: {line}")
    return 0


def _more_hint(cfg: ExperimentConfig, idle: str) -> str:
    """How to let a finished study go on."""
    if idle.startswith("study.n_trials"):
        return f"to go on, raise it (e.g. study.n_trials={(cfg.study.n_trials or 0) + 10})"
    return f"to go on, raise the budget (e.g. study.max_restarts={cfg.study.max_restarts + 10})"


def _run(cfg: ExperimentConfig, space: SearchSpace) -> int:
    from rayspec.tune._lock import study_lock

    with study_lock(cfg.out_dir, _say):  # one driver per study, for this driver's whole life
        return _run_locked(cfg, space)


def _run_locked(cfg: ExperimentConfig, space: SearchSpace) -> int:
    from rayspec.results import plan_recommended
    from rayspec.results import tie_note
    from rayspec.results import verdict_lines
    from rayspec.results import write_best
    from rayspec.store import StudyFolder
    from rayspec.tune._cluster import connect
    from rayspec.tune._cluster import disconnect
    from rayspec.tune._driver import idle_reason
    from rayspec.tune._driver import run_study
    from rayspec.tune._progress import make_progress
    from rayspec.tune._report import deploy_warnings
    from rayspec.tune._report import format_gains
    from rayspec.tune._report import format_table
    from rayspec.tune._report import no_pick_line
    from rayspec.tune._tiers import adaptive_tiers

    if cfg.server.engine is Engine.twin:
        _say("engine: twin — a SIMULATED SGLang node (rayspec.twin); numbers are the model's")
    else:
        _say(f"engine: sglang — real servers ({cfg.server.model_path})")
    # Decided before Ray starts: a finished study costs no cluster.
    idle = idle_reason(cfg, _say, space=space)
    if idle:
        _say(f"nothing left to run: {idle}; {_more_hint(cfg, idle)}")
        # The report too: its launch command and best.sh (written below) are both built from
        # this experiment, so a changed server.port reaches both.
        outcome = run_study(cfg, printer=_say, write_report=True, space=space)
    else:
        cluster = connect(cfg)  # puts back our SIGTERM handler, which ray.init replaces
        _say(cluster.describe())
        # A live display on a terminal; today's plain lines otherwise (CI, pipes, logs).
        progress = make_progress(
            _say, warmup=cfg.bench.warmup > 0, max_wall_s=cfg.study.max_wall_s
        )
        try:
            with progress:
                outcome = run_study(
                    cfg, printer=progress.line, slots=cluster.room, write_report=True,
                    progress=progress, space=space,
                )  # fmt: skip
        finally:
            disconnect(cluster)
    report = outcome.report
    folder = StudyFolder(cfg.out_dir)
    print()
    if outcome.stopped and not outcome.stuck:  # a stuck study's line is its error, at the end
        _say(f"stopped: {outcome.stopped}")
        if outcome.stopped.startswith("converged") and cfg.study.sampler is Sampler.belief:
            _say(
                f"  to go on: study.max_restarts={cfg.study.max_restarts + 5} (the added "
                "restarts are spent where they are worth most) or a lower study.stop_gain"
            )
    print(
        f"study {cfg.study.name}: {plural(report.restarts, 'server restart')}, "
        f"{plural(report.total, 'trial')} ({report.failed} failed, {report.pruned} pruned, "
        f"{report.reused} reused); this run added {outcome.ran} in {outcome.wall_s:.0f} s"
    )
    if report.best is None:
        measured = _measured_trials(cfg)
        _say(report.pick_note or no_pick_line(cfg, report, measured, folder.logs))
        return _stuck(outcome.stopped) if outcome.stuck else 1
    print(format_table(report))
    print("what each change bought, against the baseline:")
    for line in format_gains(report):
        print(f"  {line}")
    if outcome.pruned or report.pruned:
        print(
            f"pruning: {plural(report.pruned, 'trial')} stopped early, saving about "
            f"{report.bench_s_saved:.0f} s of benchmark time"
        )
    for scenario, row in report.best_per_scenario:
        print(f"best at scenario {scenario}: trial {row.trial}: {row.label}")
    verdict = _plan_verdict(cfg, report)
    found = adaptive_tiers(cfg, report)
    # The verified plan is the one deployed; the search's tiers only where none ran.
    plan = verdict.plan if verdict is not None else (found.plan if found else None)
    if plan is not None:
        per_load = ", ".join(f"{bs} -> {plural(steps[0], 'step')}" for bs, steps in plan.tiers)
        print(f"adaptive tiers (concurrency {per_load}): {folder.adaptive_tiers}")
    if verdict is not None:
        for line in verdict_lines(verdict):
            print(line)
    paths = write_best(cfg, report, verdict, plan)
    print()
    if report.pick_note:
        print(report.pick_note)
    tied = tie_note(report, cfg.study.pick_margin)
    if tied:
        print(tied)
    if paths:
        best = report.best
        starts = f"{best.starts} server starts pooled" if best.starts > 1 else "one server start"
        which = "trial" if len(best.trials) == 1 else "trials"
        print(
            f"best: {best.label} ({best.tok_s_mean:.1f} tok/s, {starts}: {which} "
            f"{', '.join(str(t) for t in best.trials)})"
        )
        for note in deploy_warnings(report.best):
            print(f"  warning: {note}")
        if plan is not None and plan_recommended(verdict):
            print(f"  launch it:  {paths[1]} (the per-load plan, recommended)")
            print(f"  the static pick: {folder.best_static_sh}")
        else:
            print(f"  launch it:  {paths[1]}")
            if plan is not None:
                why = "not recommended" if verdict is not None else "not verified"
                print(f"  the per-load plan ({why}): {folder.best_adaptive_sh}")
        if cfg.server.engine is Engine.twin:
            print(f"  on the twin: {folder.best_twin_sh} (here, without GPUs)")
        print(f"  details:    {paths[0]}")
    print(f"  trials:     {folder.trials}/ (Parquet, one file per trial)")
    dashboard = installed_command("optuna-dashboard")
    print(f"  study:      {dashboard} {shlex.quote(cfg.storage_url)} --host 127.0.0.1 --port 8080")
    return _stuck(outcome.stopped) if outcome.stuck else 0


def _measured_trials(cfg: ExperimentConfig) -> int:
    """Stored trials whose server ran to their end (completed, or pruned), whatever they
    measured (a reused result is no run of its own)."""
    from rayspec.store import ParquetTrialStore

    rows = ParquetTrialStore(cfg.out_dir).trial_rows()
    return sum(1 for r in rows if r.get("command") and r.get("state") in ("COMPLETE", "PRUNED"))


def _stuck(line: str) -> int:
    """A study that cannot go on as it is: its one line, exit 1 (the trials are kept)."""
    return _error(f"the study cannot go on: {line}", 1)


def _plan_verdict(cfg: ExperimentConfig, report: StudyReport) -> PlanVerdict | None:
    """The plan's verification from the stored trials (None: no plan trial)."""
    from rayspec.results import candidate_reader
    from rayspec.results import load_equivalence
    from rayspec.results import load_space
    from rayspec.results import plan_verdict
    from rayspec.store import ParquetTrialStore
    from rayspec.tune._tiers import closed_loads

    store = ParquetTrialStore(cfg.out_dir, [sc.name for sc in cfg.scenarios()[1:]])
    from rayspec.search import SearchSpace

    space = load_space(cfg.out_dir) or SearchSpace.from_config(cfg.search)
    records = store.load_records(candidate_reader(space))
    return plan_verdict(
        report, records, closed_loads(cfg), objective=cfg.scenarios()[0].name,
        start_noise=cfg.study.start_noise, equivalent=load_equivalence(cfg.out_dir),
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
