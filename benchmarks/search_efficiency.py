"""Search efficiency: how many server restarts until the study's pick is within 1 % of the optimum.

Every study here is the real :func:`rayspec.tune.run_study` (the NCCL screen, the strategy, the
Optuna study, the Parquet store, the pick of the report) with a model-backed trial function,
:class:`rayspec.testing.SimulatedTrials`: each trial is a simulated twin server start built from
the trial's exact launch (argv, environment, per-trial twin seed), measured with the field
protocol (1 warm-up, 5 runs of one 500-token request, extended up to ``bench.max_repeats`` for
results close to the best). A simulated start draws the same tokens as the HTTP twin and times
within about 0.2 % of it (``--confirm`` shows one study through the HTTP twin).

For every restart count N the pick is what the report would deploy after N server launches
(the Parquet rows up to the N-th launch); its *true* value is the twin model's noise-free
decode rate, and the optimum is the best true value over the whole space (every speculative
setting with every distinct NCCL behaviour). Cases: the field profile with the quickstart space
and with the full space (6 NCCL variables, steps 1-8, topk 1/2/4/8, draft tokens 2-16: 2.2 M
candidates), and two more profiles: a fast-interconnect dense node where NCCL barely matters and
the best tree is deep (``h200-nvlink-tp8-dense``), and the field node with a weak drafter where
speculation barely pays (``kimi-k2.5-tp8-pcie-weak-drafter``).

Usage::

    python benchmarks/search_efficiency.py [--seeds 20] [--budget 40] [--jobs 2]
        [--strategies structured,tpe,random] [--cases field/quick,field/full,...] [--slots 1]
        [--confirm]

Columns: ``to 1 %``: restarts until the pick is first within 1 % of the optimum (median / p90;
``never``: seeds that never get there within the budget); ``pick@N``: the median pick's true
value as % of the optimum after N restarts; ``final``: seeds whose pick at the end of the budget
is within 1 %; ``< floor``: seeds whose pick was ever truly worse than the best enqueued
configuration (the hand-tuned field setting); ``runs``, ``bench s``: mean measured runs and
benchmark seconds per restart (simulated seconds; a restart itself costs minutes on a real
node); ``used``: median restarts spent (a search that has its answer stops early).

``--slots N`` runs each study with N trials at once, as the driver does on a Ray cluster
(:class:`rayspec.testing.SlottedTrials`: simulated trials held about 0.2 s for the server start
plus 0.2 s per 180 simulated benchmark seconds, so slots overlap and longer benchmarks end
later; which trials overlap depends on timing, so runs are not exactly repeatable). Restarts
still count server launches of all slots; the pick after N restarts is the report over the
trials up to the N-th launch. With N > 1 the table adds ``rounds``: restarts to within 1 % / N
(median / p90), a wall-clock proxy.
"""

from __future__ import annotations

import argparse
import functools
import math
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from rayspec._config import ExperimentConfig  # noqa: E402
from rayspec._config import load_config  # noqa: E402
from rayspec._types import Candidate  # noqa: E402
from rayspec._types import SpecSettings  # noqa: E402
from rayspec.results import build_report  # noqa: E402
from rayspec.results import candidate_reader  # noqa: E402
from rayspec.results import load_equivalence  # noqa: E402
from rayspec.search import SearchSpace  # noqa: E402
from rayspec.server import server_env  # noqa: E402
from rayspec.store import ParquetTrialStore  # noqa: E402
from rayspec.testing import SimulatedTrials  # noqa: E402
from rayspec.testing import SlottedTrials  # noqa: E402
from rayspec.tune import run_study  # noqa: E402
from rayspec.twin import PerfModel  # noqa: E402
from rayspec.twin import load_profile  # noqa: E402
from rayspec.twin import resolve_nccl  # noqa: E402

EXPERIMENT = os.path.join(ROOT, "experiments", "eagle3-twin.yaml")
FULL_SPACE = os.path.join(HERE, "spaces", "full-field.yaml")
FIELD_PROTOCOL = ["bench.warmup=1", "bench.repeats=5", "bench.max_tokens=500"]
MODES = [
    "search.speculative.modes=[off,EAGLE3,EAGLE3-adaptive]",
    "search.speculative.overlap=[on,off]",
]
CASES: dict[str, list[str]] = {
    "field/quick": [*FIELD_PROTOCOL],
    "field/full": [FULL_SPACE, *FIELD_PROTOCOL],
    "nvlink/quick": [*FIELD_PROTOCOL, "server.twin.profile=h200-nvlink-tp8-dense"],
    "nvlink/full": [FULL_SPACE, *FIELD_PROTOCOL, "server.twin.profile=h200-nvlink-tp8-dense"],
    "weak/quick": [*FIELD_PROTOCOL, "server.twin.profile=kimi-k2.5-tp8-pcie-weak-drafter"],
    # SGLang's newer modes in the space: adaptive steps (one point) and the overlap scheduler
    # off for chains. Two more restarts' worth of questions; the optimum is still a static one.
    "field/modes": [*FIELD_PROTOCOL, *MODES],
    "nvlink/modes": [*FIELD_PROTOCOL, *MODES, "server.twin.profile=h200-nvlink-tp8-dense"],
    "weak/full": [
        FULL_SPACE,
        *FIELD_PROTOCOL,
        "server.twin.profile=kimi-k2.5-tp8-pcie-weak-drafter",
    ],
}
PICKS_AT = (10, 15, 30, 40)


def true_tok_s(cfg: ExperimentConfig, candidate: Candidate) -> float:
    """The twin model's noise-free decode rate of a candidate (0 when it cannot run)."""
    profile = load_profile(cfg.server.twin.profile)
    env = server_env(cfg, candidate)[0]
    try:
        nccl = resolve_nccl(env, profile)
        if candidate.spec is not None and not candidate.spec.fits_tree:
            return 0.0
        return PerfModel(profile, nccl, candidate.spec).expected_tok_s()
    except Exception:  # noqa: BLE001 - any model refusal means "cannot run"
        return 0.0


@functools.cache
def optimum(case: str) -> float:
    """The best true value over the case's whole space: every speculative setting with each
    distinct NCCL behaviour (sets with identical latency at every size are one)."""
    cfg = load_config(EXPERIMENT, CASES[case])
    space = SearchSpace.from_config(cfg.search)
    profile = load_profile(cfg.server.twin.profile)
    sizes = sorted({t * profile.model.token_bytes for t in range(1, 17)})
    behaviours: dict[tuple[float, ...], tuple[tuple[str, str], ...]] = {}
    names = [n for n, _ in space.nccl]
    import itertools

    for combo in itertools.product(*(c for _, c in space.nccl)):
        env = tuple(sorted((n, v) for n, v in zip(names, combo, strict=True) if v != "unset"))
        try:
            nccl = resolve_nccl(server_env(cfg, Candidate(nccl_env=env))[0], profile)
            sig = tuple(round(nccl.allreduce_us(s), 6) for s in sizes)
        except Exception:  # noqa: BLE001
            continue
        behaviours.setdefault(sig, env)
    specs: list[SpecSettings | None] = [None]
    for k in space.num_steps:
        for m in space.eagle_topk:
            for n in [k + 1] if m == 1 else space.num_draft_tokens:
                spec = SpecSettings("EAGLE3", k, m, n)
                if spec.fits_tree:
                    specs.append(spec)
    return max(
        true_tok_s(cfg, Candidate(nccl_env=env, spec=spec))
        for env in behaviours.values()
        for spec in specs
    )


@dataclass(frozen=True)
class StudyRun:
    case: str
    strategy: str
    seed: int
    picks: tuple[float, ...]  # true value of the pick after 1..budget restarts
    floor: float  # true value of the best enqueued configuration
    used: int  # restarts spent
    runs_per_restart: float
    bench_s_per_restart: float
    wall_s: float
    peak: int = 1  # most trials that ran at once


def one_study(case: str, strategy: str, seed: int, budget: int, slots: int = 1) -> StudyRun:
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rayspec-search-") as out:
        cfg = load_config(
            EXPERIMENT,
            [
                *CASES[case],
                f"output.dir={out}",
                f"study.sampler={strategy}",
                f"study.seed={seed}",
                f"study.max_restarts={budget}",
                f"study.name=s{seed}",
            ],
        )
        peak = 1
        space = SearchSpace.from_config(cfg.search)  # built once: the study and the picks
        if slots == 1:
            run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None, space=space)
        else:
            # A trial of the field protocol is a server start (minutes) plus its benchmark.
            trials = SlottedTrials(hold_s=0.2, per_bench_s=0.2 / 180)
            run_study(cfg, trial_fn=trials, slots=slots, printer=lambda _line: None, space=space)
            peak = trials.peak
        records = ParquetTrialStore(cfg.out_dir).load_records(candidate_reader(space))
        equivalent = load_equivalence(cfg.out_dir)
    roles = {r.trial: r.role for r in records if r.role}
    launches = [r.trial for r in records if r.launched]
    picks: list[float] = []
    for n in range(1, budget + 1):
        upto = launches[min(n, len(launches)) - 1] if launches else -1
        subset = [r for r in records if r.trial <= upto]
        report = build_report(
            subset, roles, start_noise=cfg.study.start_noise, equivalent=equivalent
        )
        picks.append(true_tok_s(cfg, report.best.candidate) if report.best else 0.0)
    floor = max(
        (true_tok_s(cfg, space.candidate(space.coerce(p))) for p in cfg.study.enqueue),
        default=0.0,
    )
    measured = [r for r in records if r.launched]
    runs = [r.result.metrics.get("runs", 0.0) for r in measured]
    bench = [r.result.metrics.get("bench_s", 0.0) for r in measured]
    return StudyRun(
        case, strategy, seed, tuple(picks), floor, len(launches),
        statistics.mean(runs) if runs else 0.0, statistics.mean(bench) if bench else 0.0,
        time.monotonic() - t0, peak,
    )  # fmt: skip


def _task(args: tuple[str, str, int, int, int]) -> StudyRun | str:
    try:
        return one_study(*args)
    except Exception as exc:  # noqa: BLE001 - reported with the table, not lost
        import traceback

        return f"{args}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-3)}"


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summarize(
    case: str, strategy: str, studies: list[StudyRun], budget: int, slots: int = 1
) -> dict[str, Any]:
    opt = optimum(case)
    first = []
    for s in studies:
        hit = next((i + 1 for i, v in enumerate(s.picks) if v >= 0.99 * opt), None)
        first.append(hit)
    hits = [h for h in first if h is not None]
    never = sum(h is None for h in first)
    ranked = sorted(h if h is not None else math.inf for h in first)
    at = {
        n: statistics.median(s.picks[min(n, budget) - 1] / opt for s in studies) for n in PICKS_AT
    }
    return {
        "case": case,
        "strategy": strategy,
        "median": statistics.median(ranked) if ranked else math.inf,
        "p90": _pct(ranked, 0.9) if ranked else math.inf,
        "never": never,
        "hits": hits,
        "at": at,
        "final": sum(s.picks[-1] >= 0.99 * opt for s in studies),
        "below_floor": sum(any(v < s.floor - 1e-9 for v in s.picks[1:]) for s in studies),
        "runs": statistics.mean(s.runs_per_restart for s in studies),
        "bench_s": statistics.mean(s.bench_s_per_restart for s in studies),
        "used": statistics.median(s.used for s in studies),
        "seeds": len(studies),
        "optimum": opt,
        "slots": slots,
        "peak": max(s.peak for s in studies),
    }


def _n(value: float) -> str:
    return "—" if math.isinf(value) else f"{value:g}"


def print_table(summaries: list[dict[str, Any]], budget: int, slots: int = 1) -> None:
    head = (
        "| case | strategy | to 1 %: median / p90 | "
        + ("rounds: median / p90 | " if slots > 1 else "")
        + "never | "
        + " | ".join(f"pick@{n}" for n in PICKS_AT if n <= budget)
        + " | final | < floor | runs | bench s | used |"
    )
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for s in summaries:
        picks = " | ".join(f"{100 * s['at'][n]:.1f} %" for n in PICKS_AT if n <= budget)
        rounds = f"{_n(s['median'] / slots)} / {_n(s['p90'] / slots)} | " if slots > 1 else ""
        print(
            f"| {s['case']} | {s['strategy']} | {_n(s['median'])} / {_n(s['p90'])} | {rounds}"
            f"{s['never']}/{s['seeds']} | {picks} | {s['final']}/{s['seeds']} | "
            f"{s['below_floor']} | {s['runs']:.1f} | {s['bench_s']:.0f} | {s['used']:g} |"
        )
    print()
    if slots > 1:
        peak = max(s["peak"] for s in summaries)
        print(f"{slots} slots (most trials at once: {peak}); rounds = restarts / {slots}")
    for case in dict.fromkeys(s["case"] for s in summaries):
        print(f"optimum {case}: {optimum(case):.2f} tok/s (true, noise-free)")


def confirm(seed: int, budget: int) -> None:
    """One study through the HTTP twin (Ray actors, real twin servers) beside the same study
    simulated in-process: the configurations launched and the picks, side by side."""
    import ray

    from rayspec.tune._cluster import connect
    from rayspec.tune._cluster import disconnect

    print(f"\nEnd-to-end confirmation (field profile, quickstart space and protocol, seed {seed}, "
          f"{budget} restarts)")  # fmt: skip
    results = {}
    for how in ("simulated", "HTTP twin"):
        with tempfile.TemporaryDirectory(prefix="rayspec-confirm-") as out:
            cfg = load_config(
                EXPERIMENT,
                [f"output.dir={out}", f"study.seed={seed}", f"study.max_restarts={budget}",
                 "cluster.include_dashboard=false", "server.port=30500"],
            )  # fmt: skip
            t0 = time.monotonic()
            if how == "simulated":
                run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None)
            else:
                cluster = connect(cfg)
                try:
                    run_study(cfg, printer=lambda _line: None, slots=1)
                finally:
                    disconnect(cluster)
                    if ray.is_initialized():
                        ray.shutdown()
            wall = time.monotonic() - t0
            space = SearchSpace.from_config(cfg.search)
            rows = ParquetTrialStore(cfg.out_dir).load_records(candidate_reader(space))
            roles = {r.trial: r.role for r in rows if r.role}
            report = build_report(rows, roles, start_noise=cfg.study.start_noise,
                                  equivalent=load_equivalence(cfg.out_dir))  # fmt: skip
            results[how] = (rows, report, wall, cfg)
    (srows, sreport, swall, cfg), (hrows, hreport, hwall, _) = (
        results["simulated"], results["HTTP twin"]
    )  # fmt: skip
    print("| trial | simulated: config | tok/s | HTTP twin: config | tok/s |")
    print("|---|---|---|---|---|")
    for a, b in zip(srows, hrows, strict=False):
        print(f"| {a.trial} | {a.candidate.label()} | {a.result.value or 0:.1f} | "
              f"{b.candidate.label()} | {b.result.value or 0:.1f} |")  # fmt: skip
    same = sum(a.candidate == b.candidate for a, b in zip(srows, hrows, strict=False))
    print(f"same configuration in {same} of {min(len(srows), len(hrows))} trials")
    opt = optimum("field/quick")
    for how, report, wall in (("simulated", sreport, swall), ("HTTP twin", hreport, hwall)):
        best = report.best
        assert best is not None
        truth = true_tok_s(cfg, best.candidate)
        print(f"{how}: pick {best.label}: measured {best.tok_s_mean:.1f}, true {truth:.1f} "
              f"({100 * truth / opt:.1f} % of the optimum {opt:.1f}), {report.restarts} restarts, "
              f"{wall:.0f} s")  # fmt: skip


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--budget", type=int, default=40)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--strategies", default="structured,tpe,random")
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--slots", type=int, default=1, help="trials at once (simulated slots)")
    p.add_argument(
        "--confirm", action="store_true", help="also run one study through the HTTP twin"
    )
    p.add_argument("--confirm-budget", type=int, default=12)
    return p


def main() -> int:
    args = parser().parse_args()
    strategies = args.strategies.split(",")
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        print(f"error: unknown case {unknown[0]!r}; choose from {', '.join(CASES)}",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.slots < 1:
        print("error: --slots must be at least 1", file=sys.stderr)
        return 2
    tasks = [(c, st, seed, args.budget, args.slots) for c in cases for st in strategies
             for seed in range(args.seeds)]  # fmt: skip
    t0 = time.monotonic()
    print(f"{len(tasks)} studies ({len(cases)} cases x {len(strategies)} strategies x "
          f"{args.seeds} seeds, {args.budget} restarts each"
          + (f", {args.slots} slots" if args.slots > 1 else "")
          + f") on {args.jobs} processes ...",
          flush=True)  # fmt: skip
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        runs = pool.map(_task, tasks, chunksize=1)
    grouped: dict[tuple[str, str], list[StudyRun]] = {}
    errors = [r for r in runs if isinstance(r, str)]
    for r in runs:
        if not isinstance(r, str):
            grouped.setdefault((r.case, r.strategy), []).append(r)
    summaries = [summarize(c, st, grouped[(c, st)], args.budget, args.slots) for c in cases
                 for st in strategies if grouped.get((c, st))]  # fmt: skip
    print(f"done in {time.monotonic() - t0:.0f} s\n")
    print_table(summaries, args.budget, args.slots)
    for error in errors:
        print(f"ERROR {error}")
    if args.confirm:
        confirm(0, args.confirm_budget)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
