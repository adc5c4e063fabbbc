"""The NCCL screen on this node: all-reduce latency of an experiment's NCCL sets, ranked.

Runs :class:`rayspec.screen.TorchNcclScreen` directly (no Ray: nothing of rayspec's Ray parts is
imported) over the NCCL space of an experiment file, at decode message sizes (hidden size x
tokens x bytes per element), and prints the machine (GPUs, NCCL, ``nvidia-smi topo -m``), one
row per set as it is measured (latency per size, time per set), and the ranking: the classes of
sets the screen cannot tell apart, as a study forms them (:func:`rayspec.screen.screen_space`).

Usage::

    python benchmarks/nccl_screen.py EXPERIMENT.yaml [dotted.key=value ...] [--world-size N]
        [--worker-python PATH] [--tokens 1,2,4] [--sizes BYTES,...] [--p2p-disable] [--json OUT]

    # the mechanics on a CPU (gloo), with an interpreter that has torch:
    python benchmarks/nccl_screen.py experiments/eagle3-twin.yaml --backend gloo --device cpu \\
        --world-size 2 --worker-python /path/to/python --tokens 1,8,64 --max-sets 8

World size 1 runs on a single GPU: a one-rank all-reduce moves no data between GPUs, so that
checks the mechanics only and ranks nothing about the interconnect.

Exit status: 0 when at least one set was measured, 1 when every set failed, 2 on bad input.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence

from rayspec._config import Engine
from rayspec._config import ExperimentConfig
from rayspec._config import load_config
from rayspec._exceptions import RayspecError
from rayspec.screen import ScreenReport
from rayspec.screen import ScreenResult
from rayspec.screen import TorchNcclScreen
from rayspec.screen import screen_space
from rayspec.search import SearchSpace

FIELD_HIDDEN = 7168  # the field model's (Kimi-K2.5) hidden size
DECODE_TOKENS = (1, 2, 4, 8, 16, 32, 64)
LARGER_TOKENS = (256, 1024)  # prefill-sized messages, for contrast
P2P_DISABLE = ("NCCL_P2P_DISABLE", ("unset", "1"))


def _ints(text: str) -> list[int]:
    try:
        values = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text}"
        ) from exc
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError(f"need positive integers: {text}")
    return values


def _run(argv: list[str]) -> str | None:
    """A command's stdout, or None when it is missing or fails (no shell)."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def visible_gpus() -> list[str]:
    """The names of the GPUs this process may use (``CUDA_VISIBLE_DEVICES`` respected)."""
    names = (_run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]) or "").splitlines()
    names = [n.strip() for n in names if n.strip()]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        wanted = [v.strip() for v in visible.split(",") if v.strip()]
        if all(v.isdigit() for v in wanted):
            return [names[int(v)] for v in wanted if int(v) < len(names)]
        return names[: len(wanted)]  # UUIDs: trust the count
    return names


def screen_overrides(overrides: Sequence[str]) -> list[str]:
    """The overrides, plus placeholders for the model paths the real engine requires: the
    screen starts no server and reads no model, so it does not ask for them."""
    given = {o.split("=", 1)[0] for o in overrides}
    placeholders = [
        f"{key}=(not used by the NCCL screen)"
        for key in ("server.model_path", "server.draft_model_path")
        if key not in given
    ]
    return [*overrides, *placeholders]


def _hidden_size(cfg: ExperimentConfig, given: int | None) -> tuple[int, str]:
    if given:
        return given, "--hidden-size"
    if cfg.search.nccl_screen.hidden_size:
        return cfg.search.nccl_screen.hidden_size, "search.nccl_screen.hidden_size"
    if cfg.server.engine is Engine.twin:
        from rayspec.twin import load_profile

        profile = cfg.server.twin.profile
        return load_profile(profile).model.hidden, f"twin profile {profile}"
    return FIELD_HIDDEN, "the field model's default; set --hidden-size for yours"


def space_tokens(cfg: ExperimentConfig, space: SearchSpace) -> list[int]:
    """Tokens per all-reduce of the space's decode steps, as ``rayspec.tune``'s
    ``message_sizes`` counts them (that module imports Ray, so it is mirrored here)."""
    concurrency = cfg.scenarios()[0].concurrency
    tokens = {1, *space.num_draft_tokens, *space.eagle_topk, *(k + 1 for k in space.num_steps)}
    return sorted(concurrency * t for t in tokens)


def _size_label(nbytes: int) -> str:
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):.3g}M"
    return f"{nbytes / 1024:.3g}K" if nbytes >= 1024 else f"{nbytes}B"


def _set_label(env: Sequence[tuple[str, str]]) -> str:
    return " ".join(f"{k.removeprefix('NCCL_')}={v}" for k, v in env) or "NCCL default"


class _Table:
    """Prints one row per measured set, as the screen goes."""

    def __init__(self, sizes: list[int], fixed: dict[str, str]) -> None:
        self.sizes = sizes
        self.fixed = fixed
        self.count = 0
        head = " ".join(f"{_size_label(s):>9}" for s in sizes)
        print(f"\n{'#':>4} {'set':<46} {'status':<6} {head} {'time s':>7}")

    def row(self, r: ScreenResult) -> None:
        self.count += 1
        env = [(k, v) for k, v in r.env if self.fixed.get(k) != v]
        if r.ok:
            cells = " ".join(f"{r.latency_at(s):>9.1f}" for s in self.sizes)
        else:
            cells = f"{'':>{10 * len(self.sizes) - 1}}"
        label = _set_label(env)
        line = f"{self.count:>4} {label:<46} {r.status.value:<6} {cells} {r.elapsed_s:>7.1f}"
        print(line + (f"\n     {r.detail}" if r.detail else ""), flush=True)


def _print_machine(args: argparse.Namespace, gpus: list[str], world_size: int) -> None:
    print(f"worker: {args.worker_python}")
    if gpus:
        kinds = sorted(set(gpus))
        print(f"GPUs visible: {len(gpus)} x {', '.join(kinds)} (nvidia-smi)")
    else:
        print("GPUs visible: none (nvidia-smi missing or found no GPU)")
    print(f"ranks: {world_size} ({args.backend} on {args.device})")
    if args.device == "cuda" and world_size == 1:
        print(
            "CAVEAT: world size 1: a one-rank all-reduce moves no data between GPUs; this run "
            "checks the mechanics only and ranks nothing about the interconnect"
        )
    if args.device == "cpu":
        print("CAVEAT: CPU ranks (gloo): NCCL variables have no effect; mechanics only")
    topo = _run(["nvidia-smi", "topo", "-m"])
    if topo:
        topo = re.sub(r"\x1b\[[0-9;]*m", "", topo)  # its header is underlined for terminals
        print("nvidia-smi topo -m:\n" + topo.rstrip())


def _print_ranking(report: ScreenReport, sizes: list[int], top: int) -> None:
    print(
        f"\nranking ({len(report.classes)} classes within {report.tolerance:.0%} at every "
        f"size; the representative, the set that sets the fewest variables, is launched):"
    )
    head = " ".join(f"{_size_label(s):>9}" for s in sizes)
    print(f"{'rank':>4} {'representative':<46} {'sets':>4} {head}")
    for cls in report.classes[:top]:
        cells = " ".join(f"{cls.latency_at(s):>9.1f}" for s in sizes)
        print(f"{cls.index:>4} {cls.label():<46} {len(cls.members):>4} {cells}")
    if len(report.classes) > top:
        print(f"     ... {len(report.classes) - top} more classes")
    if report.classes:
        print("fastest class per size:")
        for s in sizes:
            cls, _ = report.best_for(s)
            print(f"  {_size_label(s):>6} ({s} B): {cls.label()}, {cls.latency_at(s):.1f} µs")
    failed = report.failed()
    if failed:
        print(f"failed or hung ({len(failed)}; a study never launches them):")
        for r in failed:
            print(f"  {_set_label(r.env)}: {r.status.value}: {r.detail}")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("experiment", help="experiment YAML (its search.nccl space is screened)")
    p.add_argument("overrides", nargs="*", help="dotted.key=value overrides, as rayspec.tune")
    p.add_argument("--world-size", type=int, help="ranks (default: all visible GPUs; cpu: 2)")
    p.add_argument("--backend", default="nccl", help="torch.distributed backend (gloo: CPU)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument(
        "--worker-python",
        default=None,
        help="interpreter with torch (default: server.python, else this one)",
    )
    p.add_argument("--hidden-size", type=int, help="elements per token (default: the config's)")
    p.add_argument(
        "--tokens",
        type=_ints,
        help="tokens per message (default: 1-64, the space's decode sizes, 256 and 1024)",
    )
    p.add_argument("--sizes", type=_ints, help="message sizes in bytes (instead of --tokens)")
    p.add_argument("--p2p-disable", action="store_true", help="also screen NCCL_P2P_DISABLE=1")
    p.add_argument("--iters", type=int, default=50, help="timed all-reduces per size")
    p.add_argument("--warmup", type=int, default=10, help="untimed all-reduces per size")
    p.add_argument("--timeout-s", type=float, help="per set (default: the config's)")
    p.add_argument("--max-sets", type=int, help="(default: the config's search.nccl_screen)")
    p.add_argument("--tolerance", type=float, help="(default: the config's)")
    p.add_argument("--top", type=int, default=20, help="classes to print")
    p.add_argument("--json", help="write the report here (the format of nccl_screen.json)")
    args = p.parse_args(argv)
    try:
        cfg = load_config(args.experiment, screen_overrides(args.overrides))
    except RayspecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    space = SearchSpace.from_config(cfg.search)
    sc = cfg.search.nccl_screen
    args.worker_python = args.worker_python or cfg.server.python or sys.executable
    gpus = visible_gpus() if args.device == "cuda" else []
    world_size = args.world_size or (len(gpus) if args.device == "cuda" else 2)
    if world_size < 1:
        print("error: no GPU visible; pass --world-size or --device cpu", file=sys.stderr)
        return 2
    variables = list(space.nccl)
    if args.p2p_disable and all(name != P2P_DISABLE[0] for name, _ in variables):
        variables.append(P2P_DISABLE)
    if args.sizes:
        sizes, how = args.sizes, "--sizes"
    else:
        hidden, where = _hidden_size(cfg, args.hidden_size)
        tokens = args.tokens or sorted({*DECODE_TOKENS, *space_tokens(cfg, space), *LARGER_TOKENS})
        sizes = [hidden * t * sc.dtype_bytes for t in tokens]
        how = (
            f"hidden {hidden} ({where}) x tokens {','.join(map(str, tokens))} x "
            f"{sc.dtype_bytes} bytes"
        )
    _print_machine(args, gpus, world_size)
    print(f"sizes: {how}")
    print(f"space: {' '.join(f'{n}={len(c)}' for n, c in variables) or 'no NCCL variable'}")
    fixed = dict(cfg.server.env)
    table = _Table(sizes, {k: v for k, v in fixed.items() if k.startswith("NCCL_")})
    try:
        screen = TorchNcclScreen(
            world_size,
            python=args.worker_python,
            backend=args.backend,
            device=args.device,
            iters=args.iters,
            warmup=args.warmup,
            progress=table.row,
        )
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    try:
        report = screen_space(
            screen,
            variables,
            lambda env: {**fixed, **dict(env)},
            sizes,
            max_sets=args.max_sets or sc.max_sets,
            timeout_s=args.timeout_s or sc.timeout_s,
            tolerance=args.tolerance if args.tolerance is not None else sc.tolerance,
        )
    except RayspecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    elapsed_s = time.monotonic() - t0
    info = screen.info
    print(
        f"\n{report.source}; {len(report.results)} sets in {elapsed_s:.1f} s "
        f"({elapsed_s / max(1, len(report.results)):.1f} s per set)"
    )
    if info is not None:
        print(
            f"torch {info.torch_version}, NCCL {info.nccl_version or 'none'}, device "
            f"{info.device_name}, process group + first all-reduce {info.init_s:.2f} s"
        )
    _print_ranking(report, sizes, args.top)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            fh.write(report.to_json())
        print(f"report: {args.json}")
    return 0 if report.classes else 1


if __name__ == "__main__":
    sys.exit(main())
