"""The all-reduce microbenchmark worker: one process per rank, one JSON line of results.

A standalone program that imports only the standard library and torch: it runs under the
interpreter the servers use (``server.python``, the one SGLang is installed in), which need not
have rayspec's dependencies. :class:`~rayspec.screen.TorchNcclScreen` runs it by file path, once
per NCCL environment set, in a fresh process group (NCCL reads most variables once per process)::

    python rayspec/screen/_allreduce.py --world-size 8 --sizes 14336,43008 --iters 50 --warmup 10

This process imports no torch itself (one import fewer per set); it spawns ``--world-size``
rank processes. Each rank creates its process group over TCP on loopback, runs a first
all-reduce (NCCL creates its communicator lazily, so init errors surface there), then per size
a bf16 tensor of ``bytes / 2`` elements: warm-up all-reduces, then timed ones (CUDA events on
a GPU, queued behind a sleep kernel so that the host's launch cost stays out; ``perf_counter``
on the CPU). The latency of a size is the per-rank median, the slowest rank's. Rank 0 prints
one line on stdout::

    {"latency_us": [[14336, 24.1], ...], "init_s": 1.9, "world_size": 8,
     "nccl_version": "2.27.5", "torch": "2.9.1", ...}

It never creates NVLink multicast objects (the caller also exports ``NCCL_NVLS_ENABLE=0``).

Exit status: 0 on success; 1 when a rank failed (its traceback on stderr, e.g. a
``DistBackendError`` naming ``invalid usage``); 2 on bad arguments; 3 when this machine cannot
run the benchmark at all (no torch, fewer GPUs than ranks): the node's fault, not the set's.
Each rank exits if this process dies, and this process exits if its parent dies, so no rank
outlives an owner that was killed.

Test-only hooks (environment variables; never set them outside tests):

- ``RAYSPEC_ALLREDUCE_TEST_HANG=<dir>``: each rank writes its pid to ``<dir>/rank-<r>.pid`` and
  sleeps forever, before importing torch (a hang the caller must kill).
- ``RAYSPEC_ALLREDUCE_TEST_FAIL=1``: the last rank raises an NCCL-style "invalid usage" error
  after the process group exists (the other ranks are left waiting in a collective).
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import multiprocessing.connection
import os
import socket
import statistics
import sys
import threading
import time
from importlib.util import find_spec
from typing import Any

HANG_VAR = "RAYSPEC_ALLREDUCE_TEST_HANG"
FAIL_VAR = "RAYSPEC_ALLREDUCE_TEST_FAIL"
EXIT_RANK_FAILED = 1
EXIT_USAGE = 2
EXIT_UNUSABLE = 3  # the machine cannot run the benchmark: not the environment set's fault
UNUSABLE_MARK = "cannot run here: "  # before the reason, on the rank's stderr line

_BYTES_PER_ELEMENT = 2  # bf16, the activations' dtype
_ORPHAN_POLL_S = 0.5
_CALIBRATE_CYCLES = 10_000_000  # a few ms of GPU sleep
_SLEEP_BASE_US = 2_000.0
_SLEEP_PER_ITER_US = 100.0  # generous for one all-reduce's launch on a busy host
_SLEEP_ATTEMPTS = 4
_TERMINATE_WAIT_S = 5.0


class Unusable(RuntimeError):
    """This machine cannot run the benchmark (a rank exits with ``EXIT_UNUSABLE``).

    Outside rayspec's exception tree on purpose: this worker imports only the standard library
    and torch (the servers' interpreter need not have rayspec), and the error never leaves its
    process: ``screen/_torch.py`` reads the exit status and raises ``LaunchError``.
    """


def _sizes(text: str) -> list[int]:
    try:
        sizes = sorted({int(s) for s in text.split(",") if s.strip()})
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a list of byte counts: {text!r}") from exc
    if not sizes or sizes[0] < _BYTES_PER_ELEMENT:
        raise argparse.ArgumentTypeError(f"sizes must be at least {_BYTES_PER_ELEMENT} bytes")
    return sizes


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="_allreduce.py", description="All-reduce latency per message size (bf16)."
    )
    p.add_argument("--world-size", type=int, required=True, help="ranks (one GPU each on cuda)")
    p.add_argument("--sizes", type=_sizes, required=True, help="message sizes, bytes, a,b,c")
    p.add_argument("--iters", type=int, default=50, help="timed all-reduces per size")
    p.add_argument("--warmup", type=int, default=10, help="untimed all-reduces per size")
    p.add_argument("--backend", default="nccl", help="torch.distributed backend (nccl, gloo)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument(
        "--init-timeout-s", type=float, default=300.0, help="process group timeout, seconds"
    )
    return p


def _free_port() -> int:
    # Its own (rayspec.testing's free_port is the tests' one): this program imports nothing
    # of rayspec, under an interpreter that may not have it.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _exit_with_parent(parent_pid: int, on_orphan: Any) -> None:
    """Call ``on_orphan`` once ``parent_pid`` is no longer our parent (it died)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(_ORPHAN_POLL_S)
        on_orphan()

    threading.Thread(target=watch, name="orphan-watch", daemon=True).start()


def _hang_for_tests(rank: int, where: str) -> None:
    with open(os.path.join(where, f"rank-{rank}.pid"), "w", encoding="ascii") as fh:
        fh.write(str(os.getpid()))
    while True:
        time.sleep(3600)


def _sync(torch: Any, device: Any) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cycles_per_us(torch: Any) -> float:
    """The GPU's ``torch.cuda._sleep`` rate (cycles per µs), timed once with events; 0 when
    this torch has no sleep kernel (then the host's launch cost is measured too)."""
    if not hasattr(torch.cuda, "_sleep"):
        return 0.0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(_CALIBRATE_CYCLES)
    end.record()
    end.synchronize()
    return float(_CALIBRATE_CYCLES / max(start.elapsed_time(end) * 1e3, 1.0))


def _gpu_times_us(torch: Any, dist: Any, x: Any, iters: int, cycles_per_us: float) -> list[float]:
    """Each all-reduce's GPU time, the host kept out of it.

    Launching an all-reduce costs the host about as long as a small one takes on the GPU, so
    timed back to back the GPU would wait for the host between events and the launch cost would
    be measured. A sleep kernel first holds the stream while every iteration is queued; then
    the all-reduces run back to back, as inside a decode step's CUDA graph. If queueing took
    longer than the sleep, all ranks agree to repeat with a longer one (so every rank issues
    the same collectives).
    """
    sleep_us = _SLEEP_BASE_US + iters * _SLEEP_PER_ITER_US
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for _ in range(_SLEEP_ATTEMPTS if cycles_per_us > 0 else 1):
        torch.cuda.synchronize()
        if cycles_per_us > 0:
            torch.cuda._sleep(int(sleep_us * cycles_per_us))
        t0 = time.perf_counter()
        for start, end in zip(starts, ends, strict=True):
            start.record()
            dist.all_reduce(x)
            end.record()
        queued_us = (time.perf_counter() - t0) * 1e6
        torch.cuda.synchronize()
        if cycles_per_us <= 0:
            break
        late = torch.tensor([float(queued_us >= sleep_us)], device=x.device)
        dist.all_reduce(late, op=dist.ReduceOp.MAX)
        if not late.item():
            break
        sleep_us = 2 * max(queued_us, sleep_us)
    return [s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends, strict=True)]


def _median_us(
    torch: Any, dist: Any, device: Any, nbytes: int, iters: int, warmup: int, cycles_per_us: float
) -> float:
    # Zeros: a sum of zeros never overflows bf16, whatever the iteration count.
    x = torch.zeros(max(1, nbytes // _BYTES_PER_ELEMENT), dtype=torch.bfloat16, device=device)
    for _ in range(warmup):
        dist.all_reduce(x)
    _sync(torch, device)
    if device.type == "cuda":
        times_us = _gpu_times_us(torch, dist, x, iters, cycles_per_us)
    else:
        times_us = []
        for _ in range(iters):
            t0 = time.perf_counter()
            dist.all_reduce(x)
            times_us.append((time.perf_counter() - t0) * 1e6)
    return float(statistics.median(times_us))


def _nccl_version(torch: Any) -> str:
    try:
        version = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):  # a build without NCCL
        return ""
    return ".".join(str(v) for v in version) if isinstance(version, tuple) else str(version)


def _benchmark(rank: int, opts: dict[str, Any], port: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    world_size: int = opts["world_size"]
    if opts["device"] == "cuda":
        if not torch.cuda.is_available() or torch.cuda.device_count() < world_size:
            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
            raise Unusable(f"{world_size} ranks need {world_size} GPUs; {count} visible")
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    t0 = time.perf_counter()
    dist.init_process_group(
        opts["backend"],
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=opts["init_timeout_s"]),
    )
    probe = torch.zeros(1, dtype=torch.bfloat16, device=device)
    dist.all_reduce(probe)  # NCCL builds its communicator here, so init errors surface here
    _sync(torch, device)
    init_s = time.perf_counter() - t0
    if os.environ.get(FAIL_VAR) and rank == world_size - 1:
        raise RuntimeError(
            f"NCCL error in: {FAIL_VAR} (test hook), invalid usage (run with NCCL_DEBUG=WARN "
            f"for details), NCCL version {_nccl_version(torch) or 'unknown'}"
        )
    sizes: list[int] = opts["sizes"]
    rate = _cycles_per_us(torch) if device.type == "cuda" else 0.0
    medians = [
        _median_us(torch, dist, device, n, opts["iters"], opts["warmup"], rate) for n in sizes
    ]
    # The all-reduce ends when the slowest rank's does: report the worst rank's median.
    worst = torch.tensor(medians, dtype=torch.float64, device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    latency = [[n, round(float(t), 3)] for n, t in zip(sizes, worst.tolist(), strict=True)]
    dist.destroy_process_group()
    return {
        "latency_us": latency,
        "init_s": round(init_s, 4),
        "world_size": world_size,
        "nccl_version": _nccl_version(torch),
        "torch": str(torch.__version__),
        "backend": opts["backend"],
        "device": opts["device"],
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
    }


def _run_rank(rank: int, opts: dict[str, Any], port: int, parent_pid: int) -> None:
    """One rank (the spawned process's target): rank 0 prints the result line."""
    _exit_with_parent(parent_pid, lambda: os._exit(EXIT_RANK_FAILED))
    hang = os.environ.get(HANG_VAR)
    if hang:
        _hang_for_tests(rank, hang)
    try:
        result = _benchmark(rank, opts, port)
    except Unusable as exc:
        print(f"[rank {rank}] {UNUSABLE_MARK}{exc}", file=sys.stderr, flush=True)
        sys.exit(EXIT_UNUSABLE)
    if rank == 0:
        print(json.dumps(result), flush=True)


def _join(procs: list[Any]) -> int:
    """Wait for every rank; on the first failure stop the others. The exit status."""
    while True:
        running = [p for p in procs if p.exitcode is None]
        failed = [p for p in procs if p.exitcode not in (None, 0)]
        if failed or not running:
            break
        multiprocessing.connection.wait([p.sentinel for p in running])
    if not failed:
        return 0
    for p in running:
        p.terminate()  # the others wait in a collective that will never complete
    for p in running:
        p.join(_TERMINATE_WAIT_S)
        if p.exitcode is None:
            p.kill()
            p.join()
    first = failed[0]
    print(f"rank {procs.index(first)} exited with status {first.exitcode}", file=sys.stderr)
    if any(p.exitcode == EXIT_UNUSABLE for p in failed):
        return EXIT_UNUSABLE
    return EXIT_RANK_FAILED


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; the exit status (see the module docstring)."""
    parser = _parser()
    try:
        ns = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else EXIT_USAGE
    if ns.world_size < 1 or ns.iters < 1 or ns.warmup < 0 or ns.init_timeout_s <= 0:
        print("world size and iters must be >= 1, warmup >= 0, timeout > 0", file=sys.stderr)
        return EXIT_USAGE
    if find_spec("torch") is None:
        print(f"torch is not importable by {sys.executable}", file=sys.stderr)
        return EXIT_UNUSABLE
    ctx = multiprocessing.get_context("spawn")  # never fork a process that may hold CUDA
    procs: list[Any] = []

    def on_orphan() -> None:
        for p in procs:
            p.kill()
        os._exit(EXIT_RANK_FAILED)

    _exit_with_parent(os.getppid(), on_orphan)
    opts = {k: getattr(ns, k) for k in vars(ns)}
    port = _free_port()
    for rank in range(ns.world_size):
        proc = ctx.Process(
            target=_run_rank, args=(rank, opts, port, os.getpid()), name=f"allreduce-rank{rank}"
        )
        proc.start()
        procs.append(proc)
    return _join(procs)


if __name__ == "__main__":
    # Run by path, this file's folder is sys.path[0]; its private module names must not shadow
    # anything torch imports (the ranks inherit this sys.path).
    here = os.path.dirname(os.path.abspath(__file__))
    if sys.path and os.path.abspath(sys.path[0] or os.curdir) == here:
        del sys.path[0]
    sys.exit(main())
