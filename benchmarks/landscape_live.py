"""Live studies on the CPU landscape: ``python -m rayspec.tune`` (a subprocess, as a user runs
it, structured search) against real SGLang on this CPU, with the recorded landscape's models,
space and protocol; each study's pick after every restart is judged against the recording.

The experiment is the recorder's (``benchmarks/landscape/cpu.py``: the SGLang env's python, the
CPU flags, the test scaffolding in ``server.env``) with the space of
``benchmarks/spaces/cpu-landscape.yaml`` and a study's protocol (1 warm-up, 5 runs of one
96-token request, extended up to 15 for a result close to the best). Truth is the recorded
landscape's: a setting's mean over all its recorded starts (``benchmarks/landscapes``).

While a study runs, every process of its tree and every server reaper that names its folder
is put into an autogroup of nice -10, as the recorder's servers are (``landscape/autogroup.py``).

Usage::

    python benchmarks/landscape_live.py [--drafter strong] [--seeds 0,1] [--budget 20]
        [--runs /var/tmp/rayspec-landscape-live] [--out benchmarks/results/landscape_live.txt]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from benchmarks.landscape import cpu  # noqa: E402
from benchmarks.landscape.autogroup import AUTOGROUP_NICE  # noqa: E402
from benchmarks.landscape.autogroup import set_autogroup_nice  # noqa: E402
from benchmarks.landscape.models import landscape_models  # noqa: E402
from benchmarks.landscape.store import landscape_path  # noqa: E402
from benchmarks.landscape.store import read_landscape  # noqa: E402
from benchmarks.landscape.summary import setting_stats  # noqa: E402
from rayspec._config import ExperimentConfig  # noqa: E402
from rayspec.results import build_report  # noqa: E402
from rayspec.results import candidate_reader  # noqa: E402
from rayspec.results import load_equivalence  # noqa: E402
from rayspec.search import SearchSpace  # noqa: E402
from rayspec.server._process import process_tree  # noqa: E402
from rayspec.store import ParquetTrialStore  # noqa: E402
from rayspec.testing._twin import free_port  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "landscape_live.txt"
RUNS = Path("/var/tmp/rayspec-landscape-live")
PROTOCOL = {"warmup": 1, "repeats": 5, "max_repeats": 15}


class Renicer(threading.Thread):
    """Puts the study's processes (its tree, and reapers naming its folder) into autogroups
    of ``nice`` until stopped."""

    def __init__(self, root_pid: int, folder: str, nice: int = AUTOGROUP_NICE) -> None:
        super().__init__(daemon=True)
        self.root_pid, self.folder, self.nice = root_pid, os.fsencode(folder), nice
        self.done = threading.Event()
        self.seen: set[int] = set()

    def run(self) -> None:
        while not self.done.wait(0.5):
            pids = set(process_tree(self.root_pid))
            for entry in os.listdir("/proc"):
                if entry.isdigit() and int(entry) not in self.seen:
                    try:
                        with open(f"/proc/{entry}/cmdline", "rb") as fh:
                            if self.folder in fh.read():
                                pids.add(int(entry))
                    except OSError:
                        continue
            for pid in pids - self.seen:
                if not set_autogroup_nice(pid, self.nice):
                    self.seen.add(pid)


def experiment(drafter: str, seed: int, budget: int, runs: Path) -> dict[str, Any]:
    models = landscape_models(cpu.sglang_python())
    base = cpu.base_experiment(
        models, drafter, name=f"live-{drafter}-s{seed}", out_dir=runs, port=free_port()
    )
    doc = cpu.experiment_with_space(base)
    doc["study"].update(max_restarts=budget, sampler="structured", seed=seed)
    doc["bench"].update(PROTOCOL)
    return doc


def run_study(doc: dict[str, Any], runs: Path, nice: int) -> tuple[int, str, float]:
    """``python -m rayspec.tune`` of ``doc``; returns its exit status, stop line and seconds."""
    name = doc["study"]["name"]
    runs.mkdir(parents=True, exist_ok=True)
    path = runs / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    log = runs / f"{name}.log"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    t0 = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rayspec.tune", str(path)],
            cwd=str(ROOT),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        set_autogroup_nice(proc.pid, nice)
        renicer = Renicer(proc.pid, str(runs / name), nice)
        renicer.start()
        code = proc.wait()
        renicer.done.set()
    text = log.read_text(errors="replace")
    # The log's lines carry a time of day first ("00:35:59 stopped: ...").
    stop = next(
        (ln for ln in reversed(text.splitlines()) if "] " not in ln and " stopped: " in f" {ln}"),
        "",
    )
    return code, stop, time.monotonic() - t0


def picks_by_restart(cfg: ExperimentConfig) -> tuple[list[str], int]:
    """The report's pick after each server launch (as the search benchmark judges it), and
    the launches."""
    space = SearchSpace.from_config(cfg.search)
    records = ParquetTrialStore(cfg.out_dir).load_records(candidate_reader(space))
    equivalent = load_equivalence(cfg.out_dir)
    roles = {r.trial: r.role for r in records if r.role}
    launches = [r.trial for r in records if r.launched]
    labels = []
    for upto in launches:
        subset = [r for r in records if r.trial <= upto]
        report = build_report(
            subset, roles, start_noise=cfg.study.start_noise, equivalent=equivalent
        )
        labels.append(report.best.candidate.label() if report.best else "-")
    return labels, len(launches)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", default="strong")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--budget", type=int, default=20)
    ap.add_argument("--runs", type=Path, default=RUNS)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--autogroup-nice", type=int, default=AUTOGROUP_NICE)
    args = ap.parse_args(argv)
    rows, _ = read_landscape(landscape_path(ROOT / "benchmarks" / "landscapes", args.drafter))
    truth = {s.setting: s.mean for s in setting_stats(rows)}
    if not truth:
        print(f"error: --drafter: no recorded landscape for {args.drafter!r}", file=sys.stderr)
        return 2
    best_label = max(truth, key=lambda k: truth[k])
    optimum = truth[best_label]
    set_autogroup_nice("self", args.autogroup_nice)
    lines = [
        f"# Live studies on cpu-{args.drafter} (benchmarks/landscape_live.py)",
        "",
        "python -m rayspec.tune, structured search, real SGLang on this CPU; protocol 1 warm-up,",
        "5 runs of one 96-token request, up to 15 for a close result; budget "
        f"{args.budget} restarts. Truth: the recorded landscape's means over starts; its best is",
        f"{best_label.split(';')[0]} at {optimum:.2f} tok/s.",
        "",
    ]
    for seed in (int(s) for s in args.seeds.split(",")):
        doc = experiment(args.drafter, seed, args.budget, args.runs)
        cfg = cpu.load_experiment(doc)
        code, stop, wall = run_study(doc, args.runs, args.autogroup_nice)
        labels, used = picks_by_restart(cfg)
        within = next(
            (n for n, lb in enumerate(labels, 1) if truth.get(lb, 0.0) >= 0.99 * optimum), None
        )
        final = labels[-1] if labels else "-"
        lines += [
            f"## seed {seed}: {used} restarts, exit {code}, {wall / 60:.0f} min",
            f"{stop or '(no stop line)'}",
            f"final pick: {final.split(';')[0]}, truth {truth.get(final, float('nan')):.2f} "
            f"tok/s ({truth.get(final, 0.0) / optimum - 1:+.1%} against the best); "
            f"within 1 % of the best after: {within if within else 'never'} restarts",
            "pick after each restart (truth):",
        ]
        lines += [
            f"  {n:>2}: {lb.split(';')[0]} ({truth.get(lb, float('nan')):.2f})"
            for n, lb in enumerate(labels, 1)
        ]
        lines.append("")
        args.out.write_text("\n".join(lines))
        print("\n".join(lines[-len(labels) - 5 :]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
