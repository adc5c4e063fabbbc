"""Twin fidelity: the field table of docs/twin-model.md, measured over HTTP against the twin.

For each field row it starts a twin (``python -m rayspec.twin.server``) with that row's NCCL
environment and speculative flags, flushes the cache, runs 1 warm-up and N single requests with
``max_new_tokens=500`` through httpx streaming, and prints the field figures beside the twin's
mean and peak client-side tok/s (completion tokens / whole request time, TTFT included, as the
field measurement) and the ratio per row. The ``model`` column is the performance model's
expected decode rate (no noise, no TTFT) for reference; ``twin decode`` is the twin's rate after
the first chunk (TTFT excluded). The twin must be within 5 % of the field on the mean.

``--sweep N`` instead measures seeds 0..N-1 in process (``SimulatedServer``: the twin's
engine without HTTP, the same draws request by request) and prints, per row, the spread of the
mean ratio over seeds and how many seeds miss the tolerance: with the calibrated noise (a run's
CV is 4-5 % with speculation, docs/twin-model.md, *Noise*) a 5-run mean itself moves about ±2 %.

Usage::

    python benchmarks/twin_fidelity.py [--runs 5] [--max-tokens 500] [--seed 0] [--profile NAME]
    python benchmarks/twin_fidelity.py --sweep 40

Exit status: 0 when every row's mean is within the tolerance, 1 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time

import httpx

from rayspec._types import SpecSettings
from rayspec.testing import FIELD_TUNED_NCCL
from rayspec.testing._twin import TwinProcess
from rayspec.twin import PerfModel
from rayspec.twin import load_profile
from rayspec.twin import resolve_nccl

TUNED = dict(FIELD_TUNED_NCCL)
PROMPT = (
    "Write a detailed essay about the history of tensor parallel inference servers and the "
    "engineering trade-offs of speculative decoding on PCIe machines."
)


def eagle(steps: int, topk: int, ndt: int) -> tuple[str, ...]:
    return (
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        "eagle3-drafter",
        "--speculative-num-steps",
        str(steps),
        "--speculative-eagle-topk",
        str(topk),
        "--speculative-num-draft-tokens",
        str(ndt),
    )


@dataclasses.dataclass(frozen=True)
class Row:
    label: str
    field_avg: float
    field_peak: float
    env: dict[str, str]
    flags: tuple[str, ...]
    spec: SpecSettings | None = None


ROWS = (
    Row("baseline, no speculation, NCCL tuned", 88.8, 89.0, TUNED, ()),
    Row("baseline, no speculation, NCCL default", 62.9, 63.0, {}, ()),
    Row(
        "EAGLE-3 5 steps, NCCL default",
        71.3,
        75.3,
        {},
        eagle(5, 1, 6),
        SpecSettings("EAGLE3", 5, 1, 6),
    ),
    Row(
        "EAGLE-3 5 steps, NCCL tuned",
        86.7,
        94.0,
        TUNED,
        eagle(5, 1, 6),
        SpecSettings("EAGLE3", 5, 1, 6),
    ),
    Row(
        "EAGLE-3 2 steps (3 draft, topk 1), NCCL tuned",
        94.0,
        96.9,
        TUNED,
        eagle(2, 1, 3),
        SpecSettings("EAGLE3", 2, 1, 3),
    ),
)


def one_request(client: httpx.Client, max_tokens: int) -> tuple[float, float, float | None]:
    """One streamed request: whole-request tok/s, decode tok/s after the first chunk, and the
    accept length (None without speculation)."""
    body = {
        "text": PROMPT,
        "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0},
        "stream": True,
    }
    t0 = time.perf_counter()
    first: tuple[float, int] | None = None
    meta: dict[str, object] = {}
    with client.stream("POST", "/generate", json=body) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                meta = json.loads(line[6:])["meta_info"]
                if first is None:
                    first = (time.perf_counter(), int(meta["completion_tokens"]))  # type: ignore[call-overload]
    end = time.perf_counter()
    tokens = int(meta["completion_tokens"])  # type: ignore[call-overload]
    assert first is not None
    decode = (tokens - first[1]) / (end - first[0])
    accept = meta.get("spec_accept_length")
    return tokens / (end - t0), decode, float(accept) if accept is not None else None  # type: ignore[arg-type]


def model_tok_s(row: Row, profile_name: str) -> float:
    """The model's expected decode tok/s at batch 1 (no noise, no TTFT), for reference."""
    profile = load_profile(profile_name)
    # SGLang's own write (docs/sglang.md, *Flags rayspec keeps out*)
    env = {"NCCL_NVLS_ENABLE": "0", **row.env}
    return PerfModel(profile, resolve_nccl(env, profile), row.spec).expected_tok_s(1)


def measure(row: Row, runs: int, max_tokens: int, seed: int, profile: str) -> dict[str, float]:
    args = ["--tp-size", "8", "--twin-seed", str(seed), "--twin-profile", profile, *row.flags]
    with TwinProcess(args, env=row.env, startup_s=0.3) as twin:
        twin.wait_ready()
        timeout = httpx.Timeout(10.0, read=60.0)
        with httpx.Client(base_url=twin.base_url, timeout=timeout, trust_env=False) as client:
            client.post("/flush_cache").raise_for_status()
            one_request(client, max_tokens)  # warm-up, discarded
            results = [one_request(client, max_tokens) for _ in range(runs)]
    rates = [r for r, _, _ in results]
    accepts = [a for _, _, a in results if a is not None]
    return {
        "mean": statistics.fmean(rates),
        "peak": max(rates),
        "stdev": statistics.stdev(rates) if len(rates) > 1 else 0.0,
        "decode": statistics.fmean(d for _, d, _ in results),
        "accept": statistics.fmean(accepts) if accepts else float("nan"),
    }


def sweep(seeds: int, runs: int, max_tokens: int, profile: str, tolerance: float) -> None:
    """The mean ratio of every row over ``seeds`` seeds, in process."""
    from rayspec.twin._simulate import SimulatedServer
    from rayspec.twin._text import count_prompt_tokens

    prompt_tokens = count_prompt_tokens(PROMPT)
    print(
        f"twin fidelity over seeds 0..{seeds - 1} (in process): {runs} runs x {max_tokens} "
        f"tokens after 1 warm-up, profile {profile}"
    )
    print(
        f"| {'config':<48} | field avg | min ratio | median | max ratio | seeds outside "
        f"±{tolerance:.0%} |"
    )
    print(f"|{'-' * 50}|-----------|-----------|--------|-----------|{'-' * 19}|")
    for row in ROWS:
        ratios = []
        for seed in range(seeds):
            argv = ["--model-path", "m", "--tp-size", "8", "--twin-seed", str(seed),
                    "--twin-profile", profile, *row.flags]  # fmt: skip
            server = SimulatedServer(argv, {"NCCL_NVLS_ENABLE": "0", **row.env})
            server.generate(prompt_tokens, max_tokens)  # warm-up, discarded
            reqs = [server.generate(prompt_tokens, max_tokens) for _ in range(runs)]
            mean = statistics.fmean(1000.0 * r.completion_tokens / r.e2e_ms for r in reqs)
            ratios.append(mean / row.field_avg)
        outside = sum(abs(r - 1) > tolerance for r in ratios)
        print(f"| {row.label:<48} | {row.field_avg:9.1f} | {min(ratios):9.3f} "
              f"| {statistics.median(ratios):6.3f} | {max(ratios):9.3f} "
              f"| {outside:>17} |", flush=True)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="measured requests per row")
    parser.add_argument("--max-tokens", type=int, default=500, help="tokens per request")
    parser.add_argument("--seed", type=int, default=0, help="--twin-seed of every twin")
    parser.add_argument("--profile", default="kimi-k2.5-tp8-pcie", help="--twin-profile")
    parser.add_argument("--tolerance", type=float, default=0.05, help="allowed |mean ratio - 1|")
    parser.add_argument(
        "--sweep",
        type=int,
        default=0,
        metavar="N",
        help="measure seeds 0..N-1 in process and print the spread per row",
    )
    ns = parser.parse_args(argv)
    if ns.sweep > 0:
        sweep(ns.sweep, ns.runs, ns.max_tokens, ns.profile, ns.tolerance)
        return 0
    header = (
        f"| {'config':<48} | field avg | field peak | model | twin mean | twin peak | twin sd "
        f"| twin decode "
        f"| accept len | mean ratio | peak ratio |"
    )
    print(
        f"twin fidelity: {ns.runs} runs x {ns.max_tokens} tokens after 1 warm-up, "
        f"seed {ns.seed}, profile {ns.profile}"
    )
    print(header)
    print("|" + "|".join("-" * (len(c)) for c in header.split("|")[1:-1]) + "|")
    ok = True
    for row in ROWS:
        m = measure(row, ns.runs, ns.max_tokens, ns.seed, ns.profile)
        ratio = m["mean"] / row.field_avg
        ok = ok and abs(ratio - 1) <= ns.tolerance
        accept = "-" if m["accept"] != m["accept"] else f"{m['accept']:.2f}"
        print(
            f"| {row.label:<48} | {row.field_avg:9.1f} | {row.field_peak:10.1f} "
            f"| {model_tok_s(row, ns.profile):5.1f} "
            f"| {m['mean']:9.1f} | {m['peak']:9.1f} | {m['stdev']:7.2f} | {m['decode']:11.1f} "
            f"| {accept:>10} "
            f"| {ratio:10.3f} | {m['peak'] / row.field_peak:10.3f} |",
            flush=True,
        )
    print("all rows within tolerance" if ok else "SOME ROWS OUTSIDE TOLERANCE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
