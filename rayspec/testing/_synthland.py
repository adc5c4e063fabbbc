"""A small synthetic landscape in the recorded format, for tests of the replay and its users.

:func:`synthetic_landscape` writes what a recorded sweep would hold (:mod:`rayspec.store`'s
landscape format: every request of several starts of every setting), drawn from a toy node
whose numbers are nobody's measurement: no speculation at ``base_tok_s``; a setting of k steps
verifying N tokens accepts ``L = 1 + sum_i accept^i`` (a chain; a tree's N - 1 nodes add their
share of the remainder) at a cycle cost ``1 + step_cost k + token_cost (N - 1)`` plain decodes;
each start is off by a common factor (``start_sd``), each run by its own (``run_sd``). Greedy
output ids depend on the request only (run, index), as a lossless engine's do.

Example::

    land = synthetic_landscape(tmp / "cpu-toy.parquet", starts=3, runs=4)
    ReplayedTrials(land.path)
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Sequence

from rayspec._types import Candidate
from rayspec._types import SpecSettings
from rayspec.store import Landscape
from rayspec.store import LandscapeRow
from rayspec.store import read_landscape
from rayspec.store import write_landscape

__all__ = ["synthetic_landscape", "toy_settings"]


def toy_settings(
    steps: Sequence[int] = (1, 2, 3),
    topks: Sequence[int] = (1, 2),
    budgets: Sequence[int] = (4, 6),
) -> list[SpecSettings | None]:
    """No speculation and every setting of the product space: a chain per step count, and the
    trees of each topk > 1 at each draft-token budget that fits (what a search space of these
    steps, topks and budgets holds)."""
    out: list[SpecSettings | None] = [None]
    for k in steps:
        for m in topks:
            for n in [k + 1] if m == 1 else budgets:
                spec = SpecSettings("EAGLE3", k, m, n)
                if spec.fits_tree:
                    out.append(spec)
    return out


def toy_tok_s(
    spec: SpecSettings | None,
    *,
    base_tok_s: float = 20.0,
    accept: float = 0.6,
    step_cost: float = 0.15,
    token_cost: float = 0.05,
) -> float:
    """The toy node's noise-free throughput of a setting."""
    if spec is None:
        return base_tok_s
    return base_tok_s * _length(spec, accept) / _cost(spec, step_cost, token_cost)


def synthetic_landscape(
    path: str | os.PathLike[str],
    *,
    drafter: str = "toy",
    settings: Sequence[SpecSettings | None] | None = None,
    starts: int = 3,
    runs: int = 5,
    warmup: int = 1,
    max_tokens: int = 64,
    start_sd: float = 0.03,
    run_sd: float = 0.01,
    seed: int = 0,
    base_tok_s: float = 20.0,
    accept: float = 0.6,
) -> Landscape:
    """Write a synthetic landscape file and return it as read back.

    Args:
        path: the file to write.
        drafter: the ``drafter`` column.
        settings: the settings swept (default :func:`toy_settings`).
        starts, runs, warmup: server starts per setting, measured runs per start (one request
            each, as the field protocol), warm-up requests per start.
        max_tokens: every request's output length.
        start_sd, run_sd: the relative sd of a start's common offset and of a run's own.
        seed: the draws' seed.
        base_tok_s, accept: the toy node's plain decode rate and per-depth acceptance.
    """
    rng = random.Random(seed)
    rows: list[LandscapeRow] = []
    chosen = list(toy_settings() if settings is None else settings)
    for spec in chosen:
        level = toy_tok_s(spec, base_tok_s=base_tok_s, accept=accept)
        label = Candidate(spec=spec).label()
        for start in range(starts):
            offset = math.exp(rng.gauss(0.0, start_sd))
            startup = 20.0 + rng.random()
            began = 1.7e9 + 3600.0 * start
            for run in [-1] * (warmup > 0) + list(range(runs)):
                count = warmup if run < 0 else 1
                tok_s = level * offset * math.exp(rng.gauss(0.0, run_sd))
                e2e = 1000.0 * max_tokens / tok_s
                for index in range(count):
                    rows.append(
                        _row(
                            drafter,
                            spec,
                            label,
                            start,
                            run,
                            index,
                            tok_s,
                            e2e,
                            max_tokens,
                            accept,
                            startup,
                            began,
                        )  # fmt: skip
                    )
    out = os.fspath(path)
    meta = {
        "synthetic": True,
        "max_tokens": max_tokens,
        "recipe": "rayspec.testing.synthetic_landscape (a toy node, nobody's measurement)",
        "command": f"synthetic_landscape({out!r}, seed={seed})",
    }
    write_landscape(out, rows, meta)
    return read_landscape(out)


def _row(
    drafter: str, spec: SpecSettings | None, label: str, start: int, run: int, index: int,
    tok_s: float, e2e: float, tokens: int, accept: float, startup: float, began: float,
) -> LandscapeRow:  # fmt: skip
    ttft = 0.02 * e2e
    gaps = tuple([(e2e - ttft) / max(tokens - 1, 1)] * (tokens - 1))
    hist: tuple[int, ...] | None = None
    verify: int | None = None
    length: float | None = None
    if spec is not None:
        length = _length(spec, accept)
        verify = max(1, round(tokens / length))
        # A histogram whose mean accepted drafts is about L - 1: the two nearest counts.
        lo = max(0, min(spec.num_steps, math.floor(length - 1)))
        hi = min(spec.num_steps, lo + 1)
        share_hi = min(1.0, max(0.0, (length - 1) - lo)) if hi > lo else 0.0
        n_hi = round(verify * share_hi)
        counts = [0] * (hi + 1)
        counts[lo] += verify - n_hi
        counts[hi] += n_hi
        hist = tuple(counts)
        length = tokens / verify
    ids = tuple((run * 7919 + index * 104729 + t * 31) % 32000 for t in range(tokens))
    return LandscapeRow(
        drafter=drafter, mode="EAGLE3" if spec is not None else "off",
        num_steps=spec.num_steps if spec else None, eagle_topk=spec.eagle_topk if spec else None,
        num_draft_tokens=spec.num_draft_tokens if spec else None, setting=label, start=start,
        run=run, index=index, tok_s=tokens / (e2e / 1000.0), prompt_tokens=40 + index,
        completion_tokens=tokens, ttft_ms=ttft, e2e_ms=e2e, itl_ms=gaps, accept_length=length,
        spec_verify_ct=verify, accept_histogram=hist, output_ids=ids, startup_s=startup,
        load_1m=0.5, started_unix_s=began + 60.0 * (run + 1),
    )  # fmt: skip


def _length(spec: SpecSettings, accept: float) -> float:
    """Tokens per cycle: a chain's ``1 + sum_i accept^i``; a tree's extra nodes add a third of
    what the chain misses each, at most the chain one step deeper's."""
    chain = 1.0 + sum(accept**i for i in range(1, spec.num_steps + 1))
    extra = spec.num_draft_tokens - 1 - spec.num_steps
    if extra <= 0:
        return chain
    deeper = chain + accept ** (spec.num_steps + 1)
    return min(deeper, chain + extra * (1.0 - accept) * accept / 3.0)


def _cost(spec: SpecSettings, step_cost: float, token_cost: float) -> float:
    return 1.0 + step_cost * spec.num_steps + token_cost * (spec.num_draft_tokens - 1)
