"""Record a real engine's landscape: real SGLang 0.5.23 on this CPU, every speculative setting of
``benchmarks/spaces/cpu-landscape.yaml`` for each drafter, several server starts each.

A benchmark run, not a CI test; it takes hours (docs/landscapes.md). Each start is launched
and measured by rayspec's own code, as a study's trial is: ``build_launch`` of the experiment
and the setting's ``Candidate``, the SGLang process backend (``backend_for``), and
``run_benchmark_detailed`` with the study's plan (``bench_plan``: 1 warm-up request, then 8 runs
of one 96-token request, the prompts of ``request_input``), so a recorded request is exactly a
``RequestRecord``. Per drafter, round r (r = 0 .. starts-1) starts every setting once, in an
order shuffled by ``(seed, drafter, r)``, so drift and the machine's load do not line up with a
setting; no speculation is started only while it has fewer starts than ``--starts`` (its rows go
into every drafter's file). The files are rewritten after every start; a start already in a file
is skipped, so an interrupted recording resumes where it stopped.

Usage::

    python benchmarks/record_landscape.py [--drafters strong,mid,weak] [--starts 3] [--seed 0]
        [--out benchmarks/landscapes] [--summary benchmarks/results/landscape_cpu.txt]
        [--dry-run] [--summary-only]

Output: ``benchmarks/landscapes/cpu-<drafter>.parquet`` (``benchmarks/landscape/store.py``: the
columns) and the readable summary.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shlex
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from benchmarks.landscape import cpu  # noqa: E402
from benchmarks.landscape.autogroup import AUTOGROUP_NICE  # noqa: E402
from benchmarks.landscape.autogroup import autogroup_of  # noqa: E402
from benchmarks.landscape.autogroup import set_autogroup_nice  # noqa: E402
from benchmarks.landscape.models import landscape_models  # noqa: E402
from benchmarks.landscape.store import landscape_path  # noqa: E402
from benchmarks.landscape.store import read_landscape  # noqa: E402
from benchmarks.landscape.store import starts_done  # noqa: E402
from benchmarks.landscape.store import write_landscape  # noqa: E402
from benchmarks.landscape.summary import write_summary  # noqa: E402
from rayspec._exceptions import RayspecError  # noqa: E402
from rayspec._types import Candidate  # noqa: E402
from rayspec.bench import BenchResult  # noqa: E402
from rayspec.bench import run_benchmark_detailed  # noqa: E402
from rayspec.server import backend_for  # noqa: E402
from rayspec.server import build_launch  # noqa: E402
from rayspec.testing._twin import free_port  # noqa: E402
from rayspec.tune._trial import bench_plan  # noqa: E402

OUT = ROOT / "benchmarks" / "landscapes"
SUMMARY = ROOT / "benchmarks" / "results" / "landscape_cpu.txt"
DRAFTERS = ("strong", "mid", "weak")
OFF = "off"
MAX_FAILURES_IN_A_ROW = 3


def plan_starts(
    labels: list[str],
    *,
    drafter: str,
    starts: int,
    seed: int,
    done: set[tuple[str, int]],
) -> list[tuple[int, str]]:
    """``(start, setting)`` in recording order: round r starts each setting not yet started r
    times, shuffled by ``(seed, drafter, r)``; ``done`` holds the starts recorded (no
    speculation's from any drafter's file)."""
    order = []
    for r in range(starts):
        rnd = list(labels)
        random.Random(f"{seed}/{drafter}/{r}").shuffle(rnd)
        order += [(r, label) for label in rnd if (label, r) not in done]
    return order


def rows_of(
    result: BenchResult,
    candidate: Candidate,
    *,
    drafter: str,
    start: int,
    startup_s: float,
    load_1m: float,
    started_unix_s: float,
) -> list[dict[str, Any]]:
    """One row per request of a start (the file's columns)."""
    spec = candidate.spec
    tok_s = {report.run: report.tok_s for report in result.runs}
    rows = []
    for rec in result.records:
        rows.append(
            {
                "drafter": drafter,
                "mode": spec.algorithm if spec else OFF,
                "num_steps": spec.num_steps if spec else None,
                "eagle_topk": spec.eagle_topk if spec else None,
                "num_draft_tokens": spec.num_draft_tokens if spec else None,
                "setting": candidate.label(),
                "start": start,
                "run": rec.run,
                "index": rec.index,
                "tok_s": tok_s[rec.run],
                "prompt_tokens": rec.prompt_tokens,
                "completion_tokens": rec.completion_tokens,
                "ttft_ms": rec.ttft_ms,
                "e2e_ms": rec.e2e_ms,
                "itl_ms": list(rec.itl_ms),
                "accept_length": rec.accept_length if spec else None,
                "spec_verify_ct": rec.spec_verify_ct if spec else None,
                "accept_histogram": list(rec.accept_histogram) if rec.accept_histogram else None,
                "output_ids": list(rec.output_ids or ()),
                "startup_s": startup_s,
                "load_1m": load_1m,
                "started_unix_s": started_unix_s,
            }
        )
    return rows


def one_start(
    cfg: Any, candidate: Candidate, log_dir: Path, nice: int | None
) -> tuple[BenchResult, float, float, float]:
    """Launch ``candidate`` as a study's trial is launched, measure it with the study's plan,
    tear it down. Returns the result, startup seconds, the load at the start, the start time.

    Raises:
        RayspecError: the server did not start, or a request failed.
    """
    port = free_port()
    log = log_dir / f"server-{port}.log"
    launch = build_launch(cfg, candidate, port=port, log_path=str(log))
    load_1m = os.getloadavg()[0]
    started = time.time()
    backend = backend_for(launch.engine)
    t0 = time.monotonic()
    with backend:
        backend.start(launch)
        info = backend.process_info  # type: ignore[attr-defined]
        if nice is not None and info is not None:  # the reaper's session: the server's group
            note = set_autogroup_nice(info.reaper_pid, nice)
            if note:
                print(f"note: {note}", flush=True)
        backend.wait_ready()
        startup_s = time.monotonic() - t0
        result = run_benchmark_detailed(f"http://{launch.host}:{launch.port}", bench_plan(cfg))
    failure = result.first_failure()
    if failure is not None:
        raise RayspecError(f"a request failed ({failure[0]}): {failure[1]}")
    return result, startup_s, load_1m, started


def progress(
    n: int, total: int, drafter: str, start: int, label: str, result: BenchResult, extra: str
) -> str:
    runs = [r for r in result.runs if r.run >= 0]
    mean = sum(r.tok_s for r in runs) / len(runs)
    acc = [rec.accept_length for rec in result.records if rec.run >= 0 and rec.accept_length]
    acc_text = f", accept len {sum(acc) / len(acc):.2f}" if acc else ""
    return (
        f"[{drafter} {n}/{total}] start {start}: {label} -> {mean:.2f} tok/s "
        f"({len(runs)} runs{acc_text}); {extra}"
    )


def metadata(
    models: Any, cfg: Any, drafter: str, args: argparse.Namespace, python: Path
) -> dict[str, Any]:
    return {
        "sglang_version": cpu.installed_version(python),
        "model_recipe": models.recipe,
        "models": models.shape(),
        "drafter": drafter,
        "drafter_noise": _noise(models.drafters[drafter]),
        "server_flags": {
            "extra_flags": list(cfg.server.extra_flags),
            "attention_backend": cfg.server.attention_backend,
            "max_running_requests": cfg.server.max_running_requests,
            "env": {k: v for k, v in cfg.server.env.items() if k != "PYTHONPATH"},
        },
        "max_tokens": cfg.bench.max_tokens,
        "warmup": cfg.bench.warmup,
        "runs_per_start": cfg.bench.repeats,
        "starts_per_setting": args.starts,
        "space": str(cpu.SPACE.relative_to(ROOT)),
        "seed": args.seed,
        "machine": cpu.machine(),
        "command": "python benchmarks/record_landscape.py " + shlex.join(_argv(args)),
    }


def _noise(folder: Path) -> float | None:
    import json

    value = json.loads((folder / "config.json").read_text()).get("rayspec_landscape_noise")
    return float(value) if value is not None else None


def _argv(args: argparse.Namespace) -> list[str]:
    return ["--drafters", ",".join(args.drafters), "--starts", str(args.starts)] + (
        ["--seed", str(args.seed)] if args.seed else []
    )


def record(args: argparse.Namespace) -> int:
    python = cpu.sglang_python()
    if not python.is_file():
        print(f"error: no SGLang env at {python} (build it: bash .ci/sglang-env)", file=sys.stderr)
        return 2
    models = landscape_models(python)
    unknown = [d for d in args.drafters if d not in models.drafters]
    if unknown:
        print(f"error: --drafters: unknown {unknown}; made: {sorted(models.drafters)}")
        return 2
    if args.autogroup_nice is not None and not args.dry_run:
        note = set_autogroup_nice("self", args.autogroup_nice)
        print(f"recorder autogroup: {note or autogroup_of()}", flush=True)
    log_dir = Path(tempfile.mkdtemp(prefix="rayspec-landscape-logs."))
    print(f"models {models.recipe} ({models.target.parent}); server logs in {log_dir}", flush=True)
    files = {d: landscape_path(args.out, d) for d in args.drafters}
    failures = 0
    for drafter in args.drafters:
        doc = cpu.experiment_with_space(
            cpu.base_experiment(models, drafter, name=f"landscape-{drafter}", out_dir=log_dir)
        )
        cfg = cpu.load_experiment(doc)
        candidates = {c.label(): c for c in cpu.settings(cfg)}
        if args.only:
            candidates = {k: c for k, c in candidates.items() if re.search(args.only, k)}
        off_label = next((label for label, c in candidates.items() if c.spec is None), "")
        meta = metadata(models, cfg, drafter, args, python)
        rows, _ = read_landscape(files[drafter])
        off_rows = _off_rows(files, args.out)
        rows = [r for r in rows if r["mode"] != OFF] + [dict(r, drafter=drafter) for r in off_rows]
        done = starts_done(rows)
        plan = plan_starts(
            list(candidates),
            drafter=drafter,
            starts=args.starts,
            seed=args.seed,
            done=done,
        )
        print(f"drafter {drafter}: {len(done)} starts recorded, {len(plan)} to go", flush=True)
        if args.dry_run:
            for start, label in plan:
                print(f"  start {start}: {label}")
            continue
        write_landscape(files[drafter], rows, meta)
        for n, (start, label) in enumerate(plan, 1):
            try:
                result, startup_s, load_1m, started = one_start(
                    cfg, candidates[label], log_dir, args.autogroup_nice
                )
            except (RayspecError, OSError) as exc:
                failures += 1
                print(f"[{drafter} {n}/{len(plan)}] start {start}: {label} failed: {exc}")
                if failures >= MAX_FAILURES_IN_A_ROW:
                    print(f"stopped: {failures} starts in a row failed", flush=True)
                    return 1
                continue
            failures = 0
            new = rows_of(
                result,
                candidates[label],
                drafter=drafter,
                start=start,
                startup_s=startup_s,
                load_1m=load_1m,
                started_unix_s=started,
            )
            rows += new
            write_landscape(files[drafter], rows, meta)
            if label == off_label:  # no speculation's rows go into every drafter's file
                for other in args.drafters:
                    if other != drafter and files[other].is_file():
                        o_rows, o_meta = read_landscape(files[other])
                        o_rows += [dict(r, drafter=other) for r in new]
                        write_landscape(files[other], o_rows, o_meta)
            extra = f"startup {startup_s:.0f} s, load {load_1m:.1f}"
            print(progress(n, len(plan), drafter, start, label, result, extra), flush=True)
        write_summary(args.out, args.summary)
    if not args.dry_run:
        write_summary(args.out, args.summary)
    return 0


def _off_rows(files: Mapping[str, Path], folder: Path) -> list[dict[str, Any]]:
    """No speculation's rows: those of the landscape file with the most of its starts."""
    best: list[dict[str, Any]] = []
    for path in sorted(set(files.values()) | set(folder.glob("cpu-*.parquet"))):
        rows = [r for r in read_landscape(path)[0] if r["mode"] == OFF]
        if len(starts_done(rows)) > len(starts_done(best)):
            best = rows
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafters", default=",".join(DRAFTERS))
    ap.add_argument("--starts", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--summary", type=Path, default=SUMMARY)
    ap.add_argument("--only", default="", help="a regex: record only the settings it matches")
    ap.add_argument(
        "--autogroup-nice",
        type=int,
        default=AUTOGROUP_NICE,
        help="niceness of the recorder's and each server's autogroup (docs/landscapes.md)",
    )
    ap.add_argument("--dry-run", action="store_true", help="print the plan, start nothing")
    ap.add_argument("--summary-only", action="store_true", help="rewrite the summary only")
    args = ap.parse_args(argv)
    args.drafters = [d for d in args.drafters.split(",") if d]
    if args.starts < 1:
        print("error: --starts: expected an integer >= 1", file=sys.stderr)
        return 2
    if args.summary_only:
        write_summary(args.out, args.summary)
        return 0
    return record(args)


if __name__ == "__main__":
    sys.exit(main())
