"""Client load: does one client core hold 64+ concurrent streams to the twin?

Starts the HTTP twin (``python -m rayspec.twin.server``, profile kimi-k2.5-tp8-pcie, no
speculation: one token per chunk, the client's worst case) on 127.0.0.1 with a free port and
``--max-running-requests`` above the largest concurrency, so the server is not the limit. This
process (the client, ``StreamClient``) is pinned to one core with ``os.sched_setaffinity``; the
twin is pinned to the other core when there are two or more. For each concurrency C, C workers
each stream ``--rounds`` requests of ``--max-tokens`` tokens back to back, on the wall clock
(this measures the real client, so the twin's simulated clock is not used).

Columns: ``in-flight`` is the time-weighted mean of streams in flight (each request's
start/end, over first start to last end); ``ach/off`` that over C; ``cpu s/1k tok`` the
client's ``time.process_time()`` per 1,000 tokens; ``cpu %`` of one core over the run.

    python benchmarks/client_load.py [--concurrency 1,8,32,64,128] [--max-tokens 200]
        [--rounds 2] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import dataclass

import numpy as np

from rayspec.bench import StreamClient
from rayspec.bench import StreamResult
from rayspec.testing._twin import TwinProcess

PROFILE = "kimi-k2.5-tp8-pcie"
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "client_load.txt")
COLUMNS = (
    "concurrency",
    "requests",
    "in-flight",
    "ach/off",
    "cpu s/1k tok",
    "cpu %",
    "tok/s",
    "TTFT p50 ms",
    "TTFT p99 ms",
)


@dataclass(frozen=True)
class Row:
    concurrency: int
    requests: int
    in_flight: float
    ratio: float
    cpu_s_per_1k_tok: float
    cpu_pct: float
    tok_s: float
    ttft_ms_p50: float
    ttft_ms_p99: float


def mean_in_flight(spans: list[tuple[float, float]]) -> float:
    """Time-weighted mean of requests in flight over first start to last end."""
    wall = max(e for _, e in spans) - min(s for s, _ in spans)
    return sum(e - s for s, e in spans) / wall if wall > 0 else float("nan")


async def drive(url: str, concurrency: int, max_tokens: int, rounds: int) -> Row:
    async with StreamClient(url, max_streams=concurrency, read_timeout_s=120) as client:
        # Warm-up: open every lane's connection before timing.
        await asyncio.gather(*(client.stream(f"warm {i}", 2) for i in range(concurrency)))

        async def worker(w: int) -> list[StreamResult]:
            return [await client.stream(f"p {w} {k}", max_tokens) for k in range(rounds)]

        cpu0, wall0 = time.process_time(), time.perf_counter()
        per_worker = await asyncio.gather(*(worker(w) for w in range(concurrency)))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    res = [r for rs in per_worker for r in rs]
    tokens = sum(r.completion_tokens for r in res)
    spans = [(r.t0, r.t0 + r.e2e_s) for r in res]
    ttfts = [1000 * r.ttft_s for r in res]
    in_flight = mean_in_flight(spans)
    span = max(e for _, e in spans) - min(s for s, _ in spans)
    return Row(
        concurrency=concurrency,
        requests=len(res),
        in_flight=in_flight,
        ratio=in_flight / concurrency,
        cpu_s_per_1k_tok=1000 * cpu / tokens,
        cpu_pct=100 * cpu / wall,
        tok_s=tokens / span,
        ttft_ms_p50=float(np.percentile(ttfts, 50)),
        ttft_ms_p99=float(np.percentile(ttfts, 99)),
    )


def pin() -> tuple[int, int | None]:
    """Pin this process to one core; the core left for the server (None: only one)."""
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[0]})
    return cores[0], (cores[1] if len(cores) > 1 else None)


def run(concurrencies: list[int], max_tokens: int, rounds: int) -> tuple[list[Row], str]:
    """Start the twin, run every concurrency; the rows and a line saying what was pinned."""
    client_core, server_core = pin()
    args = ["--tp-size", "8", "--twin-profile", PROFILE, "--twin-seed", "1",
            "--max-running-requests", str(max(128, 2 * max(concurrencies)))]  # fmt: skip
    with TwinProcess(args) as twin:
        assert twin.proc is not None
        if server_core is not None:
            os.sched_setaffinity(twin.proc.pid, {server_core})
        else:
            os.sched_setaffinity(twin.proc.pid, os.sched_getaffinity(0))
        pinned = (
            f"client pinned to core {client_core}, twin server to core {server_core}"
            if server_core is not None
            else f"client and twin server both on core {client_core} (one core)"
        )
        twin.wait_ready(60)
        rows = [asyncio.run(drive(twin.base_url, c, max_tokens, rounds)) for c in concurrencies]
    return rows, pinned


def table(rows: list[Row]) -> str:
    head = " | ".join(f"{c:>12}" for c in COLUMNS)
    lines = [head, "-" * len(head)]
    for r in rows:
        cells = (f"{r.concurrency}", f"{r.requests}", f"{r.in_flight:.1f}", f"{r.ratio:.3f}",
                 f"{r.cpu_s_per_1k_tok:.3f}", f"{r.cpu_pct:.0f}", f"{r.tok_s:.0f}",
                 f"{r.ttft_ms_p50:.1f}", f"{r.ttft_ms_p99:.1f}")  # fmt: skip
        lines.append(" | ".join(f"{c:>12}" for c in cells))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--concurrency", default="1,8,32,64,128", help="comma-separated")
    parser.add_argument("--max-tokens", type=int, default=200, help="tokens per request")
    parser.add_argument("--rounds", type=int, default=2, help="requests per worker")
    parser.add_argument("--write", action="store_true", help=f"write {RESULTS}")
    ns = parser.parse_args()
    concurrencies = [int(c) for c in ns.concurrency.split(",")]
    load0 = os.getloadavg()[0]
    rows, pinned = run(concurrencies, ns.max_tokens, ns.rounds)
    header = (
        f"client load: StreamClient -> twin /generate ({PROFILE}, no speculation: 1 tok/chunk), "
        f"{ns.max_tokens} tokens x {ns.rounds} rounds per worker, wall clock\n"
        f"{pinned}; {os.cpu_count()} cores, load average {load0:.1f} -> "
        f"{os.getloadavg()[0]:.1f}, python {sys.version.split()[0]}"
    )
    ratios = ", ".join(f"c{r.concurrency} {r.ratio:.3f}" for r in rows)
    text = f"{header}\n\n{table(rows)}\n\nachieved/offered: {ratios}\n"
    print(text)
    if ns.write:
        with open(RESULTS, "w") as fh:
            fh.write(
                "One run (the line below says the machine and its load): CPU figures move "
                "between runs on a shared machine.\n" + text
            )


if __name__ == "__main__":
    main()
