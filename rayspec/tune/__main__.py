"""``python -m rayspec.tune EXPERIMENT.yaml [dotted.key=value ...]``: run an experiment.

The only module that prints for the study or calls ``sys.exit``. Exit codes: 0 done, 2 bad
input (nothing started), 1 an unexpected error, 130 interrupted (run it again to resume).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from types import FrameType

from rayspec._config import Engine
from rayspec._config import ExperimentConfig
from rayspec._config import load_config
from rayspec._exceptions import ConfigError
from rayspec._exceptions import RayspecError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m rayspec.tune",
        description="Run an Optuna study over NCCL and EAGLE-3 settings with Ray actors; "
        "store every trial in Parquet; end with the best configuration as a launch command.",
        epilog="Example: python -m rayspec.tune experiments/eagle3-twin.yaml "
        "study.max_restarts=40",
    )
    p.add_argument("experiment", help="the experiment YAML file")
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="dotted overrides merged over the file"
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
    print(f"error: {message}", file=sys.stderr, flush=True)
    return code


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    del frame
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        cfg = load_config(args.experiment, args.overrides)
        from rayspec.tune._preflight import preflight

        warnings = preflight(cfg, launching=not (args.dry_run or args.print_config))
    except ConfigError as exc:
        return _error(str(exc), 2)
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr, flush=True)
    if args.print_config:
        print(cfg.to_yaml(), end="")
        return 0
    if args.dry_run:
        return _dry_run(cfg)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return _run(cfg)
    except KeyboardInterrupt:
        _say("interrupted: servers stopped; run the same command again to resume the study")
        return 130
    except ConfigError as exc:
        return _error(str(exc), 2)
    except RayspecError as exc:
        return _error(str(exc), 1)


def _dry_run(cfg: ExperimentConfig) -> int:
    from rayspec.search import SearchSpace
    from rayspec.server._command import build_launch
    from rayspec.server._command import shell_line

    space = SearchSpace.from_config(cfg.search)
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


def _run(cfg: ExperimentConfig) -> int:
    from rayspec.tune._cluster import connect
    from rayspec.tune._cluster import disconnect
    from rayspec.tune._driver import run_study
    from rayspec.tune._report import deploy_warnings
    from rayspec.tune._report import format_table
    from rayspec.tune._report import write_best

    if cfg.server.engine is Engine.twin:
        _say("engine: twin — a SIMULATED SGLang node (rayspec.twin); numbers are the model's")
    else:
        _say(f"engine: sglang — real servers ({cfg.server.model_path})")
    cluster = connect(cfg)
    # ray.init installs its own SIGTERM handler (it aborts the process): ours goes on top, so
    # SIGTERM stops the servers and exits 130 like Ctrl-C.
    signal.signal(signal.SIGTERM, _raise_interrupt)
    _say(cluster.describe())
    try:
        outcome = run_study(cfg, printer=_say, slots=cluster.slots)
    finally:
        disconnect(cluster)
    report = outcome.report
    print()
    if outcome.stopped:
        _say(f"stopped: {outcome.stopped}")
    print(
        f"study {cfg.study.name}: {report.restarts} server restarts, {report.total} trials "
        f"({report.failed} failed, {report.pruned} pruned, {report.reused} reused); this run "
        f"added {outcome.ran} in {outcome.wall_s:.0f} s"
    )
    if report.best is None:
        _say(
            "no trial completed: see the failure reasons in the trials table and the logs in "
            f"{os.path.join(cfg.out_dir, 'logs')}"
        )
        return 1
    print(format_table(report))
    if outcome.pruned or report.pruned:
        print(
            f"pruning: {report.pruned} trials stopped early, saving about "
            f"{report.bench_s_saved:.0f} s of benchmark time"
        )
    for scenario, row in report.best_per_scenario:
        print(f"best at scenario {scenario}: trial {row.trial}: {row.label}")
    paths = write_best(cfg, report)
    print()
    if report.pick_note:
        print(report.pick_note)
    if paths:
        best = report.best
        starts = f"{best.starts} server starts pooled" if best.starts > 1 else "one server start"
        print(f"best: {best.label} ({best.tok_s_mean:.1f} tok/s, {starts}: trials "
              f"{', '.join(str(t) for t in best.trials)})")
        for note in deploy_warnings(report.best):
            print(f"  warning: {note}")
        print(f"  launch it:  {paths[1]}")
        print(f"  details:    {paths[0]}")
    print(f"  trials:     {os.path.join(cfg.out_dir, 'trials')}/ (Parquet, one file per trial)")
    print(f"  study:      optuna-dashboard {cfg.storage_url} --host 127.0.0.1 --port 8080")
    return 0


if __name__ == "__main__":
    sys.exit(main())
