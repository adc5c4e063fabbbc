"""Scaling: the same twin study on 1, 2 and 4 simulated 8-GPU nodes.

Every study is the real ``run_study`` with real Ray actors and twin servers (HTTP, SSE
streams, the reaper), on a ``ray.cluster_utils.Cluster`` whose worker nodes each declare 8
fake GPUs and the custom resource ``h200`` (``cluster.node_resource=h200``), with the same
restart budget, the same seed and ``cluster.max_concurrent_trials=0`` (as many trials at once
as the nodes hold: one TP8 trial per node).

How trial length is scaled so that a 2-core machine is not the bottleneck: on a real node a
trial is minutes of server start (weights, CUDA graphs) and seconds of benchmark. The twin's
start is a sleep (``server.twin.startup_s``, default 8 s here), which costs no CPU, and the
benchmark is short (3 runs of one 100-token request, no warm-up, no extension, no pruning, so
every trial does the same work). What does cost CPU (a Python interpreter per twin server,
Ray's actor start, the streams) is then a small share of each trial, and four trials at once
fit on two cores. Raise ``--startup-s`` to move closer to a real node's ratio.

Columns: ``wall s`` (the whole ``run_study`` call: NCCL screen, search, trials, store),
``trials`` (server launches), ``trials/h``, ``efficiency`` (trials/h against n times the 1-node
trials/h), ``trial s`` (mean wall time of a trial: longer at more nodes is the machine's CPU
shared by more trials at once), ``idle`` (the share of the slots' time with no trial between the
first and the last launch: slots the driver or the search left empty while there was budget),
the pick and its *true* value (the twin model's noise-free decode rate of the picked
configuration, and as % of the best true value of any configuration any of the studies ran).

Usage::

    python benchmarks/scaling.py [--nodes 1,2,4] [--budget 24] [--seed 0] [--startup-s 8]
        [--out FILE]

It prints the table; ``--out`` also writes it to a file (the shipped results were written with
``--out benchmarks/results/scaling.txt``, which a plain run leaves alone).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from rayspec._config import ExperimentConfig  # noqa: E402
from rayspec._config import load_config  # noqa: E402
from rayspec._types import Candidate  # noqa: E402
from rayspec.server import server_env  # noqa: E402
from rayspec.testing._twin import free_port_block  # noqa: E402
from rayspec.tune import run_study  # noqa: E402
from rayspec.tune._cluster import room  # noqa: E402
from rayspec.twin import PerfModel  # noqa: E402
from rayspec.twin import load_profile  # noqa: E402
from rayspec.twin import resolve_nccl  # noqa: E402

EXPERIMENT = os.path.join(ROOT, "experiments", "eagle3-twin.yaml")
KIND = "h200"


@dataclass(frozen=True)
class Result:
    nodes: int
    wall_s: float
    trials: int
    pick: str
    pick_true: float
    best_true: float
    stopped: str
    trial_s: float  # mean wall time of a launched trial (start of its thread to its result)
    idle: float  # share of the slots' time idle between the first and the last launch


def occupancy(spans: list[tuple[float, float]], slots: int) -> float:
    """The share of ``slots`` x (first start .. last start) during which no trial ran: slots
    left idle while the study was still launching (the tail after the last launch, where
    nothing is left to start, is not counted)."""
    first = min(s for s, _ in spans)
    last = max(s for s, _ in spans)
    if last <= first:
        return 0.0
    busy = sum(max(0.0, min(e, last) - s) for s, e in spans)
    return 1.0 - busy / (slots * (last - first))


def true_tok_s(cfg: ExperimentConfig, candidate: Candidate) -> float:
    """The twin model's noise-free decode rate of a candidate (0 when it cannot run)."""
    profile = load_profile(cfg.server.twin.profile)
    try:
        nccl = resolve_nccl(server_env(cfg, candidate)[0], profile)
        if candidate.spec is not None and not candidate.spec.fits_tree:
            return 0.0
        return PerfModel(profile, nccl, candidate.spec).expected_tok_s()
    except Exception:  # noqa: BLE001 - any model refusal means "cannot run"
        return 0.0


def one_study(nodes: int, args: argparse.Namespace) -> Result:
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(prefix="rayspec-scaling-") as out:
        cfg = load_config(
            EXPERIMENT,
            [
                f"output.dir={out}",
                f"study.max_restarts={args.budget}",
                f"study.seed={args.seed}",
                "study.pruning=false",
                "bench.warmup=0",
                "bench.repeats=3",
                "bench.max_repeats=3",
                "bench.max_tokens=100",
                f"server.twin.startup_s={args.startup_s}",
                f"server.port={free_port_block(16)}",
                "cluster.max_concurrent_trials=0",
                f"cluster.node_resource={KIND}",
            ],
        )
        if room(cfg.server.tp_size, KIND) != nodes:
            raise RuntimeError(f"the cluster holds {room(8, KIND)} trials, not {nodes}")
        outcome = run_study(
            cfg, printer=lambda _l: None, slots=functools.partial(room, cfg.server.tp_size, KIND)
        )
        files = os.listdir(os.path.join(cfg.out_dir, "trials"))
        rows = [pq.read_table(os.path.join(cfg.out_dir, "trials", f)).to_pylist()[0]
                for f in files]  # fmt: skip
        launched = [r for r in rows if r["command"] and r["state"] != "FAIL"]
        best = outcome.report.best
        if best is None:
            raise RuntimeError("the study picked nothing")
        trues = {r["candidate"]: true_tok_s(cfg, _candidate(cfg, r)) for r in launched}
        spans = [(float(r["start_unix_s"]), float(r["end_unix_s"])) for r in rows if r["command"]]
        return Result(
            nodes=nodes,
            wall_s=outcome.wall_s,
            trials=sum(1 for r in rows if r["command"]),
            pick=best.label,
            pick_true=true_tok_s(cfg, best.candidate),
            best_true=max(trues.values()),
            stopped=outcome.stopped,
            trial_s=sum(e - s for s, e in spans) / len(spans),
            idle=occupancy(spans, nodes),
        )


def _candidate(cfg: ExperimentConfig, row: dict[str, object]) -> Candidate:
    """A stored row's candidate, rebuilt from its Optuna parameters."""
    import json

    from rayspec.search import SearchSpace

    params = json.loads(str(row["params"])) if row.get("params") else {}
    return SearchSpace.from_config(cfg.search).candidate(params) if params else Candidate()


def table(results: list[Result], args: argparse.Namespace) -> str:
    base = next((r for r in results if r.nodes == 1), None)
    base_rate = base.trials / base.wall_s if base else float("nan")
    best = max(r.best_true for r in results)  # the best configuration any of the studies ran
    lines = [
        f"twin study experiments/eagle3-twin.yaml, restart budget {args.budget}, seed "
        f"{args.seed}, server.twin.startup_s {args.startup_s:g}, 3 runs x 100 tokens per trial, "
        "TP8 (one trial per node)",
        "",
        "| nodes | wall s | trials | trials/h | efficiency | trial s | idle | pick | "
        "pick true tok/s | of best run |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        rate = r.trials / r.wall_s
        eff = rate / (r.nodes * base_rate) if base else float("nan")
        lines.append(
            f"| {r.nodes} | {r.wall_s:.1f} | {r.trials} | {rate * 3600:.0f} | {eff:.0%} | "
            f"{r.trial_s:.1f} | {r.idle:.0%} | {r.pick} | {r.pick_true:.1f} | "
            f"{r.pick_true / best:.1%} |"
        )
    lines.append("")
    lines.extend(f"{r.nodes} node(s) stopped: {r.stopped}" for r in results)
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", default="1,2,4")
    # 24: with 12 the first wave is mostly the queued baseline and enqueued configuration;
    # with 24 most launches are the search's own proposals made while other trials run.
    p.add_argument("--budget", type=int, default=24)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--startup-s", type=float, default=8.0)
    p.add_argument(
        "--out",
        default=None,
        help="also write the table here (the shipped one: benchmarks/results/scaling.txt)",
    )
    return p


def main() -> int:
    args = parser().parse_args()
    counts = sorted(int(n) for n in args.nodes.split(","))

    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "num_gpus": 0, "include_dashboard": False},
    )
    results = []
    try:
        ray.init(address=cluster.address, log_to_driver=False)
        for n in counts:
            while len(cluster.worker_nodes) < n:  # each worker: 8 fake GPUs of kind h200
                cluster.add_node(num_cpus=2, num_gpus=8, resources={KIND: 1})
            cluster.wait_for_nodes()
            t0 = time.monotonic()
            result = one_study(n, args)
            results.append(result)
            took = time.monotonic() - t0
            print(f"{n} node(s): {result.trials} trials, study {took:.1f} s; pick {result.pick}",
                  flush=True)  # fmt: skip
    finally:
        ray.shutdown()
        cluster.shutdown()
    text = table(results, args)
    print(text)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
        print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
