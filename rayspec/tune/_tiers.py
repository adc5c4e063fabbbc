"""Per-concurrency optima as tiers of SGLang's adaptive speculative decoding.

With several concurrency scenarios the best static configuration differs by load (on the twin,
speculation gains at concurrency 1 and loses at 16). SGLang's adaptive mode takes a JSON file
of tiers, one per batch size, each with the steps it may use
(``--speculative-adaptive-config``; docs/sglang.md, *Speculative rules*).
:func:`adaptive_tiers` turns the measured best chain (or no speculation: 0 steps) of each scenario
into those tiers (``best-adaptive.sh`` or ``best.sh`` launches them with that file:
:func:`rayspec.results.write_best`), so one server
follows the load with the steps each load measured best. Only topk-1 chains qualify: adaptive
steps are chains.

Example of what is written::

    {"1": {"candidate_steps": [2]}, "16": {"candidate_steps": [0]}}
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rayspec._config import SPEC_OFF
from rayspec._config import ExperimentConfig
from rayspec._types import Candidate
from rayspec.engines.sglang import sglang_features
from rayspec.results import Plan
from rayspec.results import Row
from rayspec.results import StudyReport
from rayspec.search._space import is_adaptive

__all__ = [
    "AdaptiveTiers",
    "adaptive_tiers",
    "closed_loads",
    "plan_may_apply",
]


@dataclass(frozen=True)
class AdaptiveTiers:
    """The tiers and where each came from.

    Attributes:
        tiers: batch size (the scenario's concurrency) -> ``{"candidate_steps": [k]}``.
        sources: batch size -> the row whose chain (or no speculation) was best there.
        start_steps: the ``--speculative-num-steps`` to launch with (in the tiers' union).
        plan: the same as data (tiers, NCCL set, algorithm): what the verification runs.
    """

    tiers: dict[str, dict[str, list[int]]]
    sources: dict[int, Row]
    start_steps: int
    plan: Plan


def adaptive_tiers(cfg: ExperimentConfig, report: StudyReport) -> AdaptiveTiers | None:
    """The tiers for this study, or None where they do not apply.

    They apply with two or more closed-loop scenarios (no ``request_rate``) of different
    concurrency, a static EAGLE/EAGLE3
    algorithm in the space, an SGLang with ``--speculative-adaptive``, and speculation best
    at one concurrency at least.
    """
    algorithms = [m for m in cfg.search.speculative.modes if m != SPEC_OFF and not is_adaptive(m)]
    if not algorithms or not sglang_features(cfg.server.version).adaptive_spec:
        return None
    primary = cfg.scenarios()[0].name
    # A tier is a batch size; a Poisson scenario's concurrency is only a cap on it.
    scenarios = [sc for sc in cfg.scenarios() if sc.request_rate is None]
    if len({sc.concurrency for sc in scenarios}) < 2:
        return None

    def tok_s(row: Row, scenario: str) -> float:
        # The first scenario is the objective (tok_s_mean, every start pooled); the others are
        # stored as <scenario>__tok_s_mean and reach the report as per_scenario.
        if scenario == primary:
            return row.tok_s_mean
        return dict(row.per_scenario).get(scenario, math.nan)

    sources: dict[int, Row] = {}
    for sc in scenarios:
        chains = [r for r in report.rows if _chain_or_off(r.candidate)]
        chains = [r for r in chains if math.isfinite(tok_s(r, sc.name))]
        if chains:
            sources[sc.concurrency] = max(chains, key=lambda r: tok_s(r, sc.name))
    steps = {bs: row.candidate.spec.num_steps if row.candidate.spec else 0
             for bs, row in sources.items()}  # fmt: skip
    positive = [k for _, k in sorted(steps.items()) if k > 0]
    if len(sources) < 2 or not positive:
        return None
    tiers = {str(bs): {"candidate_steps": [k]} for bs, k in sorted(steps.items())}
    # The NCCL set of the best chain at the lowest concurrency: one server, one environment.
    first = next(r for _, r in sorted(sources.items()) if r.candidate.spec is not None)
    spec = first.candidate.spec
    assert spec is not None
    plan = Plan(
        tiers=tuple((bs, (k,)) for bs, k in sorted(steps.items())),
        nccl_env=first.candidate.nccl_env,
        algorithm=spec.algorithm,
        start_steps=positive[0],
        overlap=spec.overlap,
    )
    return AdaptiveTiers(
        tiers=tiers, sources=dict(sorted(sources.items())), start_steps=positive[0], plan=plan
    )


def plan_may_apply(cfg: ExperimentConfig) -> bool:
    """Whether this experiment can have a plan (before any trial): two closed-loop loads or
    more, a static EAGLE/EAGLE3 algorithm in the space, an SGLang with adaptive steps."""
    algorithms = [m for m in cfg.search.speculative.modes if m != SPEC_OFF and not is_adaptive(m)]
    if not algorithms or not sglang_features(cfg.server.version).adaptive_spec:
        return False
    return len({sc.concurrency for sc in cfg.scenarios() if sc.request_rate is None}) >= 2


def closed_loads(cfg: ExperimentConfig) -> list[tuple[str, int]]:
    """(scenario, concurrency) of each closed-loop load, the objective's first."""
    return [(sc.name, sc.concurrency) for sc in cfg.scenarios() if sc.request_rate is None]


def _chain_or_off(candidate: Candidate) -> bool:
    spec = candidate.spec
    return spec is None or (
        spec.eagle_topk == 1 and not spec.adaptive and not candidate.server_settings
    )
