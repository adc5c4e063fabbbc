"""Client fidelity: does rayspec's benchmark client measure the server, not itself?

Part 1 drives a paced fake SGLang server (``rayspec.bench._fake_server`` in a subprocess, whose
emission times are logged with CLOCK_MONOTONIC stamps) and, when it starts, the digital twin
(``python -m rayspec.twin.server``, whose ``meta_info.e2e_latency`` is its scheduled
arrival-to-finish time), at concurrency 1 and 64. For every run it compares the client's
output tok/s with the ground truth from the server-side schedule and prints the error.

Part 2 measures how many streamed tokens per second one client core sustains: an unpaced fake
server streams 64 x 500 tokens and the client's ``time.process_time()`` is divided into the
tokens it handled (goal: 10,000 tok/s per core).

    python benchmarks/client_fidelity.py            # about 3 minutes
    python benchmarks/client_fidelity.py --quick    # shorter requests, about 1 minute

Rules for the ground truth:
- fake, concurrency 1: tokens / (last emission - request arrival) of the server log.
- fake, concurrency 64: a run's tokens / (its last emission - its first arrival).
- twin, concurrency 1: tokens / ``e2e_latency``.
- twin, concurrency 64: a run's tokens / (max(send_i + e2e_latency_i) - min(send_i)); the
  send time stands in for the arrival time (loopback transit is well under 1 ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx
import numpy as np

from rayspec.bench import BenchPlan
from rayspec.bench import Scenario
from rayspec.bench import StreamClient
from rayspec.bench import run_benchmark_detailed
from rayspec.bench import summarize


@dataclass
class Row:
    case: str
    runs: int
    client_tok_s: float
    truth_tok_s: float
    err_pct_mean: float
    err_pct_max: float
    client_ttft_ms: float
    truth_ttft_ms: float
    cpu_pct: float


def start_fake(*args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "rayspec.bench._fake_server", "--port", "0", *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"fake server did not start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def fake_case(
    name: str, fake_args: list[str], concurrency: int, max_tokens: int, runs: int
) -> Row:
    proc, url = start_fake(*fake_args)
    try:
        httpx.delete(url + "/fake/log", trust_env=False)
        plan = BenchPlan(
            scenarios=(
                Scenario(
                    name,
                    concurrency=concurrency,
                    requests_per_run=concurrency,
                    max_tokens=max_tokens,
                ),
            ),
            warmup=1,
            repeats=runs,
        )
        result = run_benchmark_detailed(url, plan)
        log = httpx.get(url + "/fake/log", trust_env=False).json()
    finally:
        stop(proc)
    log.sort(key=lambda e: e["recv_s"])
    log = log[len(log) - runs * concurrency :]  # drop the warm-up requests
    measured = [r for r in result.runs if r.run >= 0]
    if any(r.failed for r in measured) or len(log) != runs * concurrency:
        raise RuntimeError(f"{name}: failed requests or missing log entries")
    errs, truths = [], []
    for i, report in enumerate(measured):
        entries = log[i * concurrency : (i + 1) * concurrency]
        tokens = sum(e["tokens"][-1] for e in entries)
        span = max(e["emit_s"][-1] for e in entries) - min(e["recv_s"] for e in entries)
        truth = tokens / span
        truths.append(truth)
        errs.append(100.0 * (report.tok_s - truth) / truth)
    stats = summarize(result.records, name)
    truth_ttft = float(np.median([1000 * (e["emit_s"][0] - e["recv_s"]) for e in log]))
    return Row(
        case=f"fake {name}",
        runs=len(measured),
        client_tok_s=stats["tok_s_mean"],
        truth_tok_s=float(np.mean(truths)),
        err_pct_mean=float(np.mean(errs)),
        err_pct_max=float(np.max(np.abs(errs))),
        client_ttft_ms=stats["ttft_ms_p50"],
        truth_ttft_ms=truth_ttft,
        cpu_pct=100.0 * max(r.client_cpu_fraction for r in measured),
    )


async def _twin_runs(url: str, concurrency: int, max_tokens: int, runs: int):
    out = []
    async with StreamClient(url, max_streams=concurrency, read_timeout_s=60) as client:
        await client.http.post("/flush_cache")
        # warm-up at the measured concurrency: opens every connection of the pool
        await asyncio.gather(*(client.stream(f"warm-up {i}", 16) for i in range(concurrency)))
        for run in range(runs):
            cpu0, w0 = time.process_time(), time.perf_counter()
            res = await asyncio.gather(
                *(client.stream(f"prompt {run} {i}", max_tokens) for i in range(concurrency))
            )
            out.append((res, (time.process_time() - cpu0) / (time.perf_counter() - w0)))
    return out


def twin_case(url: str, name: str, concurrency: int, max_tokens: int, runs: int) -> Row:
    data = asyncio.run(_twin_runs(url, concurrency, max_tokens, runs))
    errs, clients, truths, ttfts, cpu = [], [], [], [], []
    for res, cpu_frac in data:
        if any(r.server_e2e_s is None for r in res):
            raise RuntimeError("twin did not report e2e_latency")
        tokens = sum(r.completion_tokens for r in res)
        if concurrency == 1:
            client = tokens / res[0].e2e_s
            truth = tokens / res[0].server_e2e_s
        else:
            t0 = min(r.t0 for r in res)
            client = tokens / (max(r.t0 + r.e2e_s for r in res) - t0)
            truth = tokens / (max(r.t0 + r.server_e2e_s for r in res) - t0)
        clients.append(client)
        truths.append(truth)
        errs.append(100.0 * (client - truth) / truth)
        ttfts.extend(1000 * r.ttft_s for r in res)
        cpu.append(cpu_frac)
    return Row(
        case=f"twin {name}",
        runs=runs,
        client_tok_s=float(np.mean(clients)),
        truth_tok_s=float(np.mean(truths)),
        err_pct_mean=float(np.mean(errs)),
        err_pct_max=float(np.max(np.abs(errs))),
        client_ttft_ms=float(np.median(ttfts)),
        truth_ttft_ms=float("nan"),
        cpu_pct=100.0 * max(cpu),
    )


def run_twin(quick: bool) -> list[Row]:
    try:
        from rayspec.twin._testing import TwinProcess
    except ImportError as exc:
        print(f"(twin not available: {exc})")
        return []
    args = [
        "--tp-size",
        "8",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        "drafter",
        "--speculative-num-steps",
        "2",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "3",
        "--twin-seed",
        "1",
    ]
    tuned = {
        "NCCL_PROTO": "LL",
        "NCCL_ALGO": "Ring",
        "NCCL_P2P_LEVEL": "SYS",
        "NCCL_MAX_NCHANNELS": "16",
        "NCCL_BUFFSIZE": "16777216",
        "NCCL_NTHREADS": "512",
    }
    rows = []
    try:
        with TwinProcess(args, env=tuned) as twin:
            twin.wait_ready(60)
            rows.append(
                twin_case(
                    twin.base_url, "c1 EAGLE3 2 steps", 1, 100 if quick else 500, 3 if quick else 5
                )
            )
            rows.append(
                twin_case(
                    twin.base_url,
                    "c64 EAGLE3 2 steps",
                    64,
                    50 if quick else 200,
                    2 if quick else 3,
                )
            )
    except Exception as exc:  # a benchmark script: report and carry on with the rest
        print(f"(twin case failed: {type(exc).__name__}: {exc})")
    return rows


async def _capacity(url: str, streams: int, max_tokens: int) -> tuple[int, int, float, float]:
    async with StreamClient(url, max_streams=streams) as client:
        await client.stream("warm", 4)
        cpu0, w0 = time.process_time(), time.perf_counter()
        res = await asyncio.gather(*(client.stream(f"p{i}", max_tokens) for i in range(streams)))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - w0
    return sum(r.completion_tokens for r in res), sum(r.chunks for r in res), cpu, wall


def capacity(pattern: str, streams: int, max_tokens: int) -> tuple[str, float, float, float]:
    proc, url = start_fake("--gap-ms", "0", "--ttft-ms", "0", "--pattern", pattern)
    try:
        tokens, chunks, cpu, wall = asyncio.run(_capacity(url, streams, max_tokens))
    finally:
        stop(proc)
    return pattern, tokens / cpu, chunks / cpu, 100 * cpu / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter requests and fewer runs")
    parser.add_argument("--no-twin", action="store_true", help="skip the twin cases")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()
    n500 = 100 if args.quick else 500
    runs = 3 if args.quick else 5
    print(f"client fidelity on {os.cpu_count()} cores, python {sys.version.split()[0]}")
    rows = [
        fake_case("c1 1 tok/chunk @10ms", ["--gap-ms", "10"], 1, n500, runs),
        fake_case(
            "c1 2,1,3 tok/chunk @20ms", ["--gap-ms", "20", "--pattern", "2,1,3"], 1, n500, runs
        ),
        fake_case("c64 1 tok/chunk @10ms", ["--gap-ms", "10"], 64, n500, 2 if args.quick else 3),
    ]
    if not args.no_twin:
        rows += run_twin(args.quick)
    head = (
        f"{'case':34} {'runs':>4} {'client tok/s':>12} {'truth tok/s':>11} "
        f"{'err % mean':>10} {'|err| % max':>11} {'TTFT ms':>8} {'truth':>6} {'cpu %':>6}"
    )
    print("\n" + head + "\n" + "-" * len(head))
    for r in rows:
        print(
            f"{r.case:34} {r.runs:>4} {r.client_tok_s:>12.1f} {r.truth_tok_s:>11.1f} "
            f"{r.err_pct_mean:>+10.2f} {r.err_pct_max:>11.2f} {r.client_ttft_ms:>8.1f} "
            f"{r.truth_ttft_ms:>6.1f} {r.cpu_pct:>6.1f}"
        )
    caps = [capacity("1", 64, 500), capacity("2", 64, 500)]
    print("\nclient capacity (unpaced fake, 64 streams x 500 tokens, cumulative /generate chunks)")
    for pattern, tok, ev, cpu_pct in caps:
        verdict = "OK" if tok >= 10_000 else "BELOW GOAL"
        print(
            f"  {pattern} tok/chunk: {tok:>8.0f} tok per client CPU-second "
            f"({ev:.0f} chunks/s; client at {cpu_pct:.0f} % of a core) goal 10,000: {verdict}"
        )
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(
                {
                    "rows": [r.__dict__ for r in rows],
                    "capacity": [
                        dict(
                            zip(
                                ("pattern", "tok_per_cpu_s", "chunks_per_cpu_s", "cpu_pct"),
                                c,
                                strict=True,
                            )
                        )
                        for c in caps
                    ],
                },
                fh,
                indent=1,
            )


if __name__ == "__main__":
    main()
