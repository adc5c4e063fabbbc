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
and with the full space (6 NCCL variables, steps 1-8, topk 1/2/4/8, draft tokens 2-16: 1.6 M
candidates), and two more profiles: a fast-interconnect dense node where NCCL barely matters and
the best tree is deep (``h200-nvlink-tp8-dense``), and the field node with a weak drafter where
speculation barely pays (``kimi-k2.5-tp8-pcie-weak-drafter``).

Cases the search was not built with (not in the default ``--cases``; their table is
``benchmarks/results/search_efficiency_unseen.txt``): ``deep/quick``, ``deep/full``, a 4-GPU PCIe
node with a dense target and a strong drafter whose optimum is the deepest draft the space
allows (``l40s-pcie-tp4-dense-deep``: 6 steps in the quickstart space, 8 in the full one);
``p2p/quick``, ``p2p/full``, the field node with broken peer-to-peer
(``kimi-k2.5-tp8-pcie-p2p-broken``: ``NCCL_P2P_LEVEL=PHB``/``SYS``, the hand-tuned setting
included, hang at the first collective); ``field3x/quick``, ``field3x/full``, the field profile
with 3x its between-start noise (``sigma_start`` 0.03).

A multi-load case, ``field/ladder`` (not in the default ``--cases``): the field profile with the
quickstart space and four scenarios, concurrency 1 (the objective, 500 tokens), 8, 32 and 64 (one
closed-loop wave of 200-token requests per run; the twin's scheduler in process). Its truth is
per load (:func:`true_tok_s_at`), and its own table counts restarts until the best per load (the
report's pick at concurrency 1, its per-scenario best at the others: what
``adaptive_tiers.json`` is built from) is within 1 % of the true best at every load. A third
table is the plan's (``study.verify_plan``: after the search, one restart runs the plan itself):
the verified plan's true value (:func:`true_plan_at`: each load's tier steps with the plan's NCCL
set, adaptive's ``adaptive_ms`` on every iteration) against the best per-load plan's
(:func:`best_plan_at`), the restart that verified it, the restarts until the plan built from the
trials so far is within 1 % (+1 for its verification), seeds where the verified plan is truly
more than 1 % below the static pick at some load, and where the report recommended it anyway.

A mixed-category case, ``field/mixed`` (not in the default ``--cases``): the ``field/ladder``
case with ``bench.prompts: mixed`` (code / math / chat / long-form, each prompt sent with its
category; the twin scales a request's acceptance by ``drafter.category_mult``). Its truth is the
mix's (:func:`mixed_tok_s`): at concurrency 1 the mean of the per-request rates over the set's
prompts (the objective is the mean over runs of one request), under load one wave of the
engine's shared cycles in which each request emits its category's accept length a cycle and the
batch shrinks as the high-acceptance requests finish. Noise-free in-process runs lie below it
as the ladder's do below its truth (the mix's ratio to the ladder's within 1-2 %).

A goodput case, ``field/goodput`` (not in the default ``--cases``): the same ladder with
``study.objective: goodput`` at concurrency 32 under ``study.slo`` (TTFT p99 1000 ms, per-request
gap p99 34 ms). Its truth is the true goodput at c32 (:func:`true_goodput`): the noise-free
throughput there of a configuration whose noise-free latency there
(:func:`true_latency_at`) meets the SLO, 0 for one that misses it; so ``to 1 %`` and ``final``
are against the best configuration that truly meets the SLO, and its own table counts the seeds
whose final pick truly meets it (the issue's goal: every seed) beside those whose pick measured
as meeting it. Results: ``benchmarks/results/search_efficiency_ladder.txt``.

Cases outside the twin's form (not in the default ``--cases``; ``benchmarks/_search_cases.py``,
results ``benchmarks/results/search_outside_form.txt``): the twin-form cases above are the
twin's model with other constants, and the search's online model (``rayspec/search/_online.py``)
assumes that very form, so they cannot show where it is wrong. ``graphs``, ``plateau``,
``topkcost`` and ``treemask`` (each ``/quick`` and ``/full``) are the field node with one
mechanism a real node has and the online model does not (docs/twin-model.md, *Model
variants*): the verify cost stepping at CUDA-graph sizes; an acceptance that drops after depth
1 and then holds; a draft step costing more with topk squared; a tree's verify paying a masked
attention path per token. Their parameters are the benchmark's (the search reads no profile).

Real cases, ``real/<drafter>``: a real engine's recorded landscape per drafter
(``benchmarks/landscapes/cpu-<drafter>.parquet``, or ``--landscapes DIR``), replayed by
:class:`rayspec.testing.ReplayedTrials` (each trial a recorded server start of its setting,
its recorded runs); the truth of a setting is its mean over every recorded start, the optimum
the best recorded setting, the floor no speculation (and the space file's enqueued setting, if
any). Results: ``benchmarks/results/search_real_landscape.txt``.

Noise: ``--start-noise-scale S`` multiplies the profile's between-start noise (``sigma_start``)
and ``--noise-scale S`` every noise term (``sigma_start``, ``sigma_accept``, ``sigma_time``), for
every case, on top of the case's own scale (``field3x``: start x3). It is applied through the
profile: each study's server runs a derived profile file (the case's profile with its noise
scaled, same name, written into the study's folder); the study's own prior
(``study.start_noise``) is left as it is, and the truth is noise-free whatever the scale.

Usage::

    python benchmarks/search_efficiency.py [--seeds 20] [--first-seed 0] [--budget 40] [--jobs 2]
        [--strategies structured,tpe,random] [--cases field/quick,field/full,...]
        [--noise-scale 1] [--start-noise-scale 1] [--slots 1] [--landscapes DIR] [--confirm]
        [--per-seed]

The truth of a configuration that never starts is 0: its first collective hangs (P2P on a
``p2p_broken`` node), NCCL refuses a variable at init, no AllReduce algorithm is left, or the
draft tree does not fit. The optimum and the floor use that truth.

Columns: ``to 1 %``: restarts until the pick is first within 1 % of the optimum (median / p90;
``never``: seeds that never get there within the budget); ``stopped after``: restarts the study
spent until it stopped (median / p90; a study that spent its whole budget counts the budget);
``by itself``: seeds whose study stopped before its budget was spent (it had its answer);
``pick@N``: the median pick's true value as % of the optimum after N restarts; ``final``: seeds
whose pick at the end of the study is within 1 %; ``< floor``: seeds whose pick was ever truly
worse than the floor, the best of the configurations every study measures first (the baseline
and the enqueued hand-tuned field setting; one that never starts is worth 0); ``runs``,
``bench s``: mean measured runs and benchmark seconds per restart (simulated seconds; a restart
itself costs minutes on a real node); ``calibration``: of the seeds whose study stopped by itself
on a stop line putting P(a rival beats the pick by > 1 %) below 20 %, how many ended on a pick
the optimum truly beats by more than 1 % (an honest stop rule keeps this under a fifth; ``—``:
no seed stopped so).

Strategies: ``structured`` (the default search), ``tpe``, ``random`` and ``grid`` (Optuna's
samplers through ``study.sampler``; the default ``--strategies`` leaves ``grid`` out). ``grid``
runs on the quickstart space only: the full space (1.6 M candidates) is too big to walk, and its
rows say so.

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
import itertools
import math
import multiprocessing
import os
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from benchmarks import _search_cases as outside  # noqa: E402
from rayspec._config import ExperimentConfig  # noqa: E402
from rayspec._config import load_config  # noqa: E402
from rayspec._types import Candidate  # noqa: E402
from rayspec._types import SpecSettings  # noqa: E402
from rayspec.bench import load_dataset  # noqa: E402
from rayspec.bench import request_input  # noqa: E402
from rayspec.results import PLAN_PARAM  # noqa: E402
from rayspec.results import PLAN_ROLE  # noqa: E402
from rayspec.results import Plan  # noqa: E402
from rayspec.results import StudyReport  # noqa: E402
from rayspec.results import believes  # noqa: E402
from rayspec.results import build_report  # noqa: E402
from rayspec.results import candidate_reader  # noqa: E402
from rayspec.results import load_equivalence  # noqa: E402
from rayspec.results import plan_verdict  # noqa: E402
from rayspec.search import SearchSpace  # noqa: E402
from rayspec.server import build_launch  # noqa: E402
from rayspec.server import server_env  # noqa: E402
from rayspec.store import ParquetTrialStore  # noqa: E402
from rayspec.testing import ReplayedTrials  # noqa: E402
from rayspec.testing import SimulatedTrials  # noqa: E402
from rayspec.testing import SlottedTrials  # noqa: E402
from rayspec.tune import run_study  # noqa: E402
from rayspec.tune._tiers import adaptive_tiers  # noqa: E402
from rayspec.tune._trial import bench_plan  # noqa: E402
from rayspec.twin import PerfModel  # noqa: E402
from rayspec.twin import load_profile  # noqa: E402
from rayspec.twin import resolve_nccl  # noqa: E402
from rayspec.twin._simulate import SimulatedServer  # noqa: E402
from rayspec.twin._text import count_prompt_tokens  # noqa: E402

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
# The table of benchmarks/results/README.md and search_efficiency.txt there: the default --cases.
DEFAULT_CASES = tuple(CASES)
DEEP = ["server.twin.profile=l40s-pcie-tp4-dense-deep", "server.tp_size=4"]
P2P_BROKEN = ["server.twin.profile=kimi-k2.5-tp8-pcie-p2p-broken"]
CASES.update(
    {
        # Cases the search was not built with (benchmarks/results/search_efficiency_unseen.txt).
        "deep/quick": [*FIELD_PROTOCOL, *DEEP],
        "deep/full": [FULL_SPACE, *FIELD_PROTOCOL, *DEEP],
        "p2p/quick": [*FIELD_PROTOCOL, *P2P_BROKEN],
        "p2p/full": [FULL_SPACE, *FIELD_PROTOCOL, *P2P_BROKEN],
        "field3x/quick": [*FIELD_PROTOCOL],
        "field3x/full": [FULL_SPACE, *FIELD_PROTOCOL],
    }
)
# Multi-load cases: scenarios at several concurrencies (closed loop, one wave of requests per
# run); the first is the objective. Their truth is per load (:func:`true_tok_s_at`) and they get
# a table of their own: restarts until the best per load is within 1 % at every load.
LADDER = (1, 8, 32, 64)
LADDER_TOKENS = 200  # the loaded scenarios' output length (500 at concurrency 1, the field's)
LADDER_SCENARIOS = (
    "bench.scenarios=["
    + ",".join(
        f"{{name: c{c}, concurrency: {c}, requests_per_run: {c}, "
        f"max_tokens: {500 if c == 1 else LADDER_TOKENS}}}"
        for c in LADDER
    )
    + "]"
)
LADDER_CASES = {"field/ladder": LADDER, "field/mixed": LADDER}
CASES.update({"field/ladder": [*FIELD_PROTOCOL, LADDER_SCENARIOS]})
# Mixed-category cases: the ladder on the built-in mixed prompt set (code / math / chat /
# long-form); the twin scales each request's acceptance by its category's
# ``drafter.category_mult``, so their truth is the mix's (:func:`mixed_tok_s`).
MIXED_CASES = frozenset({"field/mixed"})
CASES.update({"field/mixed": [*FIELD_PROTOCOL, LADDER_SCENARIOS, "bench.prompts=mixed"]})
# Goodput cases: the ladder with study.objective goodput at one load under an SLO. Their truth
# is the true goodput at that load (:func:`true_goodput`: the noise-free throughput of a
# configuration whose noise-free latency meets the SLO, else 0) and their own table counts the
# seeds whose final pick truly meets the SLO.
GOODPUT_LOAD = 32
GOODPUT_SLO = {"ttft_p99_ms": 1000.0, "itl_p99_ms": 34.0}  # splits no speculation's NCCL sets
GOODPUT_CASES = {"field/goodput": GOODPUT_LOAD}
CASES.update({
    "field/goodput": [
        *FIELD_PROTOCOL, LADDER_SCENARIOS, "study.objective=goodput",
        f"study.objective_scenario=c{GOODPUT_LOAD}",
        *(f"study.slo.{k}={v:g}" for k, v in GOODPUT_SLO.items()),
    ],
})  # fmt: skip
# Cases outside the twin's form (not in the default --cases; benchmarks/_search_cases.py):
# <variant>/quick and <variant>/full, the field node with one mechanism the search's online
# model does not have. Results: benchmarks/results/search_outside_form.txt.
OUTSIDE_CASES = outside.variant_cases(FIELD_PROTOCOL, FULL_SPACE)
CASES.update(OUTSIDE_CASES)
# Real cases: real/<drafter>, a real engine's recorded landscape replayed (--landscapes DIR, or
# benchmarks/landscapes/; spawned workers read it from RAYSPEC_LANDSCAPES). Their experiment is
# the replay's (outside.replay_experiment()). Results: search_real_landscape.txt.
REAL_CASES: dict[str, str] = {}


def register_landscapes(folder: str) -> dict[str, str]:
    """Add a ``real/<drafter>`` case per landscape file in ``folder``; returns them."""
    found = outside.landscape_files(folder)
    REAL_CASES.update(found)
    CASES.update({case: outside.real_overrides(path) for case, path in found.items()})
    return found


register_landscapes(os.environ.get("RAYSPEC_LANDSCAPES", outside.LANDSCAPES))


def experiment_of(case: str) -> str:
    """The experiment file a case's overrides go over."""
    return outside.replay_experiment() if case in REAL_CASES else EXPERIMENT


# A case's own noise: (between-start noise scale, every-noise-term scale).
CASE_NOISE: dict[str, tuple[float, float]] = {
    "field3x/quick": (3.0, 1.0),
    "field3x/full": (3.0, 1.0),
}
STRATEGIES = ("structured", "belief", "tpe", "random", "grid")  # study.sampler values
# Strategies that walk the whole space: not run on the full space (1.6 M candidates).
WALKS_THE_SPACE = frozenset({"grid"})
PICKS_AT = (10, 15, 30, 40)
_BUDGET_SPENT = "restart budget spent"
# One study: case, strategy, seed, budget, slots, (start noise scale, every-noise scale).
Task = tuple[str, str, int, int, int, tuple[float, float]]


def true_tok_s(cfg: ExperimentConfig, candidate: Candidate) -> float:
    """The twin model's noise-free decode rate of a candidate (0 when it never starts: its first
    collective hangs, NCCL refuses a variable or has no algorithm left, or the tree does not
    fit)."""
    profile = load_profile(cfg.server.twin.profile)
    env = server_env(cfg, candidate)[0]
    try:
        nccl = resolve_nccl(env, profile)
        if nccl.hang:  # P2P on a p2p_broken node: the server never gets ready
            return 0.0
        if candidate.spec is not None and not candidate.spec.fits_tree:
            return 0.0
        return PerfModel(profile, nccl, candidate.spec).expected_tok_s()
    except Exception:  # noqa: BLE001 - any model refusal means "cannot run"
        return 0.0


@functools.cache
def truth_config(case: str) -> ExperimentConfig:
    """The case's experiment as the truth sees it (its own profile, noise irrelevant)."""
    return load_config(experiment_of(case), CASES[case])


def optimum(case: str) -> float:
    """The best true value over the case's whole space (see :func:`optimum_at`)."""
    return optimum_at(case)[0]


@functools.cache
def optimum_at(case: str) -> tuple[float, Candidate]:
    """The best true value over the case's whole space and a configuration that has it: every
    speculative setting with each distinct NCCL behaviour (sets with identical latency at every
    size are one; sets that never start are left out)."""
    if case in GOODPUT_CASES:
        return max(((true_goodput(case, c), c) for c in ladder_candidates(case)),
                   key=lambda pair: pair[0])  # fmt: skip
    if case in MIXED_CASES:
        return max(((case_truth(case, c), c) for c in ladder_candidates(case)),
                   key=lambda pair: pair[0])  # fmt: skip
    if case in REAL_CASES:  # every setting of the space (no NCCL), as recorded
        every = distinct_candidates(truth_config(case), [1])
        return max(((case_truth(case, c), c) for c in every), key=lambda pair: pair[0])
    cfg = truth_config(case)
    profile = load_profile(cfg.server.twin.profile)
    sizes = sorted({t * profile.model.token_bytes for t in range(1, 17)})
    return max(
        ((true_tok_s(cfg, candidate), candidate) for candidate in distinct_candidates(cfg, sizes)),
        key=lambda pair: pair[0],
    )


def distinct_candidates(cfg: ExperimentConfig, sizes: Sequence[int]) -> tuple[Candidate, ...]:
    """Every speculative setting of ``cfg``'s space with each distinct NCCL behaviour: sets
    with identical all-reduce latency at every one of ``sizes`` are one; sets that hang are
    left out (they never start)."""
    space = SearchSpace.from_config(cfg.search)
    profile = load_profile(cfg.server.twin.profile)
    behaviours: dict[tuple[float, ...], tuple[tuple[str, str], ...]] = {}
    names = [n for n, _ in space.nccl]
    for combo in itertools.product(*(c for _, c in space.nccl)):
        env = tuple(sorted((n, v) for n, v in zip(names, combo, strict=True) if v != "unset"))
        try:
            nccl = resolve_nccl(server_env(cfg, Candidate(nccl_env=env))[0], profile)
            if nccl.hang:
                continue
            sig = tuple(round(nccl.allreduce_us(size), 6) for size in sizes)
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
    return tuple(
        Candidate(nccl_env=env, spec=spec) for env in behaviours.values() for spec in specs
    )


def floor_of(case: str) -> float:
    """The truth every study of the case is sure to reach: the best of the baseline (no
    speculation, NCCL unset) and the enqueued configurations (0 for one that never starts)."""
    cfg = truth_config(case)
    space = SearchSpace.from_config(cfg.search)
    return max(
        [
            case_truth(case, Candidate()),
            *(case_truth(case, space.candidate(space.coerce(p))) for p in cfg.study.enqueue),
        ]
    )  # a list: an experiment may enqueue nothing


def case_truth(case: str, candidate: Candidate) -> float:
    """What a case judges a pick by: the true goodput at its load for a goodput case, the
    recorded mean for a real case, the noise-free decode rate at batch 1 otherwise."""
    if case in REAL_CASES:
        return outside.real_truth(REAL_CASES[case], candidate)
    if case in GOODPUT_CASES:
        return true_goodput(case, candidate)
    if case in MIXED_CASES:
        return true_tok_s_at(case, candidate, 1)
    return true_tok_s(truth_config(case), candidate)


@functools.cache
def _running_cap(case: str, speculative: bool) -> int:
    """``max_running_requests`` of the case's servers, with or without speculation."""
    cfg = truth_config(case)
    spec = SpecSettings("EAGLE3", 2, 1, 3) if speculative else None
    launch = build_launch(cfg, Candidate(spec=spec), port=0, log_path=os.devnull)
    return SimulatedServer(launch.argv[3:], dict(launch.env)).max_running


@functools.cache
def _ladder_ctx(case: str, concurrency: int) -> float:
    """The mean context of a ladder scenario's decode: its prompts (run 0) plus half its
    output."""
    scenario = next(
        s for s in bench_plan(truth_config(case)).scenarios if s.name == f"c{concurrency}"
    )
    asks = [request_input(scenario, 0, i) for i in range(scenario.requests_per_run)]
    prompt = statistics.mean(count_prompt_tokens(a.prompt) for a in asks)
    return prompt + scenario.max_tokens / 2


@functools.cache
def true_tok_s_at(case: str, candidate: Candidate, concurrency: int) -> float:
    """The noise-free throughput of one run of ``concurrency`` equal requests (a ladder case's
    truth at that load; :func:`true_tok_s` at concurrency 1): the requests run in waves of at
    most ``max_running_requests`` (the rest queue), each wave at the model's decode rate for
    its batch at the scenario's mean context, ``concurrency / sum(1 / r(B))`` with ``r(B)`` one
    request's rate at batch B. 0 when it never starts. What a run measures lies 0-10 % below it
    (prefill, and the wave's end waiting for its slowest request; docs/twin-model.md)."""
    cfg = truth_config(case)
    base = true_tok_s(cfg, candidate)
    if base == 0.0 or (concurrency == 1 and case not in MIXED_CASES):
        return base
    profile = load_profile(cfg.server.twin.profile)
    cap = _running_cap(case, candidate.spec is not None)
    waves = [cap] * (concurrency // cap) + ([concurrency % cap] if concurrency % cap else [])
    ctx = _ladder_ctx(case, concurrency)
    try:
        nccl = resolve_nccl(server_env(cfg, candidate)[0], profile)
        model = PerfModel(profile, nccl, candidate.spec)
        if case in MIXED_CASES:
            return mixed_tok_s(case, model, concurrency, cap)
        return concurrency / sum(1.0 / model.expected_tok_s(b, ctx) for b in waves)
    except Exception:  # noqa: BLE001 - any model refusal means "cannot run"
        return 0.0


@functools.cache
def true_plan_at(case: str, plan: Plan, concurrency: int) -> float:
    """The noise-free throughput of a plan at one load: its tier's steps as a chain (0: plain
    decoding) with its NCCL set, every iteration paying adaptive mode's cost (the profile's
    ``adaptive_ms``), waves of the speculative ``max_running_requests``; as
    :func:`true_tok_s_at` otherwise. 0 when it never starts."""
    steps = plan.steps_at(concurrency)
    spec = (
        SpecSettings(plan.algorithm, steps, 1, steps + 1, overlap=plan.overlap) if steps else None
    )
    cfg = truth_config(case)
    profile = load_profile(cfg.server.twin.profile)
    candidate = Candidate(nccl_env=plan.nccl_env, spec=spec)
    try:
        nccl = resolve_nccl(server_env(cfg, candidate)[0], profile)
        if nccl.hang:
            return 0.0
        model = PerfModel(profile, nccl, spec, adaptive=True)
        if case in MIXED_CASES:
            return mixed_tok_s(case, model, concurrency, _running_cap(case, True))
        if concurrency == 1:
            return model.expected_tok_s()
        cap = _running_cap(case, True)
        waves = [cap] * (concurrency // cap) + ([concurrency % cap] if concurrency % cap else [])
        ctx = _ladder_ctx(case, concurrency)
        return concurrency / sum(1.0 / model.expected_tok_s(b, ctx) for b in waves)
    except Exception:  # noqa: BLE001 - any model refusal means "cannot run"
        return 0.0


@functools.cache
def _run_mults(case: str, concurrency: int) -> tuple[float, ...]:
    """The acceptance multipliers (``drafter.category_mult``) of a ladder scenario's requests:
    every prompt of the set at concurrency 1 (one request per run, the runs walking the set),
    run 0's requests in their order under load."""
    cfg = truth_config(case)
    drafter = load_profile(cfg.server.twin.profile).drafter
    scenario = next(s for s in bench_plan(cfg).scenarios if s.name == f"c{concurrency}")
    if concurrency == 1:
        return tuple(drafter.mult_for(r.category) for r in load_dataset(scenario.prompt_set))
    n = scenario.requests_per_run
    return tuple(drafter.mult_for(request_input(scenario, 0, i).category) for i in range(n))


def mixed_tok_s(case: str, model: PerfModel, concurrency: int, cap: int) -> float:
    """The noise-free throughput of a mixed-category ladder scenario, as the client measures
    it. At concurrency 1 a run is one request: the objective (the mean over runs) is the mean
    of the per-request rates ``1000 L(m) / step_ms(1)``, each prompt of the set once. Under
    load one closed-loop wave: the twin's engine runs every running request in one cycle of
    ``step_ms(B, ctx)`` (its cost does not depend on acceptance) and each request emits
    ``L(m)`` tokens a cycle, so a request needs ``tokens / L(m)`` cycles; requests of a
    high-acceptance category finish first and the batch shrinks (queued requests take freed
    slots, at most ``cap`` running). The run's tokens over that time (mean context as
    :func:`true_tok_s_at`)."""
    mults = _run_mults(case, concurrency)
    if concurrency == 1:
        return statistics.mean(1000.0 * model.expected_accept_length(m) for m in mults) / (
            model.step_ms(1)
        )
    tokens = next(
        s.max_tokens for s in bench_plan(truth_config(case)).scenarios
        if s.name == f"c{concurrency}"
    )  # fmt: skip
    ctx = _ladder_ctx(case, concurrency)
    need = [tokens / model.expected_accept_length(m) for m in mults]  # cycles per request
    queue, running, clock = list(need), [], 0.0
    while queue or running:
        while queue and len(running) < cap:
            running.append(queue.pop(0))
        step = min(running)  # cycles until the next request finishes
        clock += step * model.step_ms(len(running), ctx)
        running = [r - step for r in running if r - step > 1e-9]
    return 1000.0 * tokens * len(need) / clock


@functools.cache
def best_plan_at(case: str) -> tuple[tuple[float, ...], Plan]:
    """The best per-load plan's true value at each load: of every plan (one NCCL behaviour,
    each load's steps among 0 and the space's chain steps), the one whose values are highest at
    every load (per NCCL set, each load's best steps; then the set best at most loads, ties by
    the sum). Also returns that plan."""
    loads = LADDER_CASES[case]
    space = SearchSpace.from_config(truth_config(case).search)
    envs = dict.fromkeys(c.nccl_env for c in ladder_candidates(case))
    best: tuple[tuple[float, ...], Plan] | None = None
    for env in envs:
        tiers = []
        values = []
        for c in loads:
            options = [
                (true_plan_at(case, Plan(((c, (k,)),), env, "EAGLE3", max(k, 1)), c), k)
                for k in [0, *space.num_steps]
            ]
            value, k = max(options)
            tiers.append((c, (k,)))
            values.append(value)
        start = next((k for _, (k,) in tiers if k > 0), 1)
        plan = Plan(tuple(tiers), env, "EAGLE3", start)
        if best is None or sum(values) > sum(best[0]):
            best = (tuple(values), plan)
    assert best is not None
    return best


@functools.cache
def ladder_candidates(case: str) -> tuple[Candidate, ...]:
    """Every speculative setting of the case's space with each distinct NCCL behaviour at
    every payload a ladder load sends (up to the largest load x 16 tokens)."""
    cfg = truth_config(case)
    profile = load_profile(cfg.server.twin.profile)
    sizes = sorted({t * profile.model.token_bytes for t in range(1, 16 * max(LADDER) + 1, 7)})
    return distinct_candidates(cfg, sizes)


@functools.cache
def optimum_at_load(case: str, concurrency: int) -> tuple[float, Candidate]:
    """The best true value at one load of a ladder case, and a configuration that has it."""
    return max(
        ((true_tok_s_at(case, c, concurrency), c) for c in ladder_candidates(case)),
        key=lambda pair: pair[0],
    )


@functools.cache
def true_latency_at(case: str, candidate: Candidate, concurrency: int) -> tuple[float, float]:
    """The noise-free (TTFT, per-request p99 gap) in ms of one closed-loop wave at
    ``concurrency`` (inf, inf when it never starts): the wave's first batch is admitted as one
    prefill (its TTFT), and a request's p99 gap is a one-token cycle of the full batch at the
    end of its output (the longest step it sees; with speculation one-token cycles are common,
    without it every cycle is one). The in-process simulation measures within 0.3 % of both."""
    cfg = truth_config(case)
    if true_tok_s(cfg, candidate) == 0.0:
        return math.inf, math.inf
    scenario = next(s for s in bench_plan(cfg).scenarios if s.name == f"c{concurrency}")
    asks = [request_input(scenario, 0, i) for i in range(scenario.requests_per_run)]
    batch = min(concurrency, _running_cap(case, candidate.spec is not None))
    prompts = [count_prompt_tokens(a.prompt) for a in asks[:batch]]
    profile = load_profile(cfg.server.twin.profile)
    model = PerfModel(profile, resolve_nccl(server_env(cfg, candidate)[0], profile),
                      candidate.spec)  # fmt: skip
    end_ctx = statistics.mean(prompts) + scenario.max_tokens
    return model.prefill_ms(sum(prompts)), model.step_ms(batch, end_ctx)


def truly_meets_slo(case: str, candidate: Candidate) -> bool:
    """Whether the configuration's noise-free latency at the case's load meets its SLO."""
    ttft, itl = true_latency_at(case, candidate, GOODPUT_CASES[case])
    return ttft <= GOODPUT_SLO["ttft_p99_ms"] and itl <= GOODPUT_SLO["itl_p99_ms"]


@functools.cache
def true_goodput(case: str, candidate: Candidate) -> float:
    """A goodput case's truth: the noise-free throughput at its load when the configuration's
    noise-free latency there meets the SLO, else 0."""
    if not truly_meets_slo(case, candidate):
        return 0.0
    return true_tok_s_at(case, candidate, GOODPUT_CASES[case])


def ladder_picks(case: str, report: StudyReport) -> tuple[float, ...]:
    """The true value at each load of the study's best for that load: the report's pick for
    the objective (the first scenario), its per-scenario best for the others (0: none yet)."""
    best = dict(report.best_per_scenario)
    picks = []
    for i, c in enumerate(LADDER_CASES[case]):
        row = report.best if i == 0 else best.get(f"c{c}")
        picks.append(true_tok_s_at(case, row.candidate, c) if row is not None else 0.0)
    return tuple(picks)


def noisy_profile(name: str, start_scale: float, all_scale: float, folder: str) -> str:
    """A profile file of ``name`` (a built-in name or a path) with its noise scaled: every sigma
    x ``all_scale``, and ``sigma_start`` x ``start_scale`` on top. Same name and constants
    otherwise; written into ``folder``; returns its path."""
    if os.path.isfile(name):
        with open(name, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    else:
        ref = resources.files("rayspec.twin").joinpath("profiles", f"{name}.yaml")
        data = yaml.safe_load(ref.read_text(encoding="utf-8"))
    noise = data["noise"]
    if isinstance(noise, dict):  # `noise: off` stays off
        for key in ("sigma_time", "sigma_accept", "sigma_start"):
            noise[key] = float(noise[key]) * all_scale
        noise["sigma_start"] *= start_scale
    path = os.path.join(folder, f"noise-x{all_scale:g}-start-x{start_scale:g}.yaml")
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(data, fh, sort_keys=False)
    return path


@dataclass(frozen=True)
class StudyRun:
    case: str
    strategy: str
    seed: int
    picks: tuple[float, ...]  # true value of the pick after 1..budget restarts
    floor: float  # true value of the best configuration every study measures first
    used: int  # restarts spent until the study stopped
    by_itself: bool  # it stopped before its budget was spent
    runs_per_restart: float
    bench_s_per_restart: float
    wall_s: float
    peak: int = 1  # most trials that ran at once
    # A ladder case: per restart count, the true value at each load of the best for that load.
    load_picks: tuple[tuple[float, ...], ...] = ()
    # A ladder case's plan: per restart count, the true value at each load of the plan built
    # from the trials so far (empty tuple: none yet); the verified plan's (the study's own
    # verification trial) true values, the restart that verified it, and the static pick's
    # true values at each load at the end; whether the report recommended the plan.
    plan_picks: tuple[tuple[float, ...], ...] = ()
    verified: tuple[float, ...] = ()
    verified_at: int = 0
    static_final: tuple[float, ...] = ()
    recommended: bool = False
    # A goodput case: whether the final pick truly meets the SLO, and whether it measured so.
    final_meets: bool | None = None
    final_feasible: bool | None = None
    # The pick's label after 1..budget restarts (``--per-seed``).
    pick_labels: tuple[str, ...] = ()
    # The study's own stop line's P(a rival beats the pick by > 1 %), in % (None: none said).
    stop_p: float | None = None


def one_study(
    case: str,
    strategy: str,
    seed: int,
    budget: int,
    slots: int = 1,
    noise: tuple[float, float] = (1.0, 1.0),
) -> StudyRun:
    """One study of ``case``; ``noise``: (start, all) noise scales on top of the case's own."""
    t0 = time.monotonic()
    start_scale = noise[0] * CASE_NOISE.get(case, (1.0, 1.0))[0]
    all_scale = noise[1] * CASE_NOISE.get(case, (1.0, 1.0))[1]
    truth = truth_config(case)
    with tempfile.TemporaryDirectory(prefix="rayspec-search-") as out:
        overrides = []
        if (start_scale, all_scale) != (1.0, 1.0) and case not in REAL_CASES:
            path = noisy_profile(truth.server.twin.profile, start_scale, all_scale, out)
            overrides.append(f"server.twin.profile={path}")
        cfg = load_config(
            experiment_of(case),
            [
                *CASES[case],
                *overrides,
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
            replayed = case in REAL_CASES
            trial_fn = ReplayedTrials(REAL_CASES[case]) if replayed else SimulatedTrials()
            outcome = run_study(cfg, trial_fn=trial_fn, printer=lambda _line: None, space=space)
        else:
            # A trial of the field protocol is a server start (minutes) plus its benchmark.
            trials = SlottedTrials(hold_s=0.2, per_bench_s=0.2 / 180)
            outcome = run_study(
                cfg, trial_fn=trials, slots=slots, printer=lambda _line: None, space=space
            )
            peak = trials.peak
        records = ParquetTrialStore(cfg.out_dir).load_records(candidate_reader(space))
        equivalent = load_equivalence(cfg.out_dir)
    roles = {r.trial: r.role for r in records if r.role}
    launches = [r.trial for r in records if r.launched]
    picks: list[float] = []
    labels: list[str] = []
    load_picks: list[tuple[float, ...]] = []
    plan_picks: list[tuple[float, ...]] = []
    loads = LADDER_CASES.get(case, ())
    for n in range(1, budget + 1):
        if 1 < n and len(launches) < n:  # the study had stopped: the same trials, the same pick
            picks.append(picks[-1])
            labels.append(labels[-1])
            if case in LADDER_CASES:
                load_picks.append(load_picks[-1])
                plan_picks.append(plan_picks[-1])
            continue
        upto = launches[min(n, len(launches)) - 1] if launches else -1
        subset = [r for r in records if r.trial <= upto]
        report = build_report(
            subset, roles, start_noise=cfg.study.start_noise, equivalent=equivalent,
            belief=believes(cfg),
        )  # fmt: skip
        picks.append(case_truth(case, report.best.candidate) if report.best else 0.0)
        labels.append(report.best.candidate.label() if report.best else "-")
        if case in LADDER_CASES:
            load_picks.append(ladder_picks(case, report))
            found = adaptive_tiers(cfg, report)
            plan_picks.append(
                tuple(true_plan_at(case, found.plan, c) for c in loads) if found else ()
            )
    verified: tuple[float, ...] = ()
    verified_at, static_final, recommended = 0, (), False
    plans = [r for r in records if r.role == PLAN_ROLE and r.launched]
    if plans and case in LADDER_CASES:
        last = max(plans, key=lambda r: r.trial)
        checked = Plan.from_json(str(last.params[PLAN_PARAM]))
        verified = tuple(true_plan_at(case, checked, c) for c in loads)
        verified_at = int(last.restart or 0)
        closing = build_report(records, roles, start_noise=cfg.study.start_noise,
                               equivalent=equivalent, belief=believes(cfg))  # fmt: skip
        if closing.best is not None:
            static_final = tuple(true_tok_s_at(case, closing.best.candidate, c) for c in loads)
        verdict = plan_verdict(
            closing, records, [(f"c{c}", c) for c in loads], objective=cfg.scenarios()[0].name,
            start_noise=cfg.study.start_noise, equivalent=equivalent,
        )  # fmt: skip
        recommended = verdict is not None and verdict.recommended
    final = report.best if case in GOODPUT_CASES and launches else None
    measured = [r for r in records if r.launched]
    runs = [r.result.metrics.get("runs", 0.0) for r in measured]
    bench = [r.result.metrics.get("bench_s", 0.0) for r in measured]
    return StudyRun(
        case, strategy, seed, tuple(picks), floor_of(case), len(launches),
        not outcome.stopped.startswith(_BUDGET_SPENT),
        statistics.mean(runs) if runs else 0.0, statistics.mean(bench) if bench else 0.0,
        time.monotonic() - t0, peak, tuple(load_picks), tuple(plan_picks), verified,
        verified_at, static_final, recommended,
        truly_meets_slo(case, final.candidate) if final else None,
        final.feasible if final else None, tuple(labels),
        outside.stop_probability(outcome.stopped),
    )  # fmt: skip


def _task(args: Task) -> StudyRun | str:
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
        "calibration": outside.calibration(
            [s.picks[-1] for s in studies],
            [s.stop_p if s.by_itself else None for s in studies],
            opt,
        ),
        "below_floor": sum(any(v < s.floor - 1e-9 for v in s.picks[1:]) for s in studies),
        "runs": statistics.mean(s.runs_per_restart for s in studies),
        "bench_s": statistics.mean(s.bench_s_per_restart for s in studies),
        "stopped": statistics.median(s.used for s in studies),
        "stopped_p90": _pct([s.used for s in studies], 0.9),
        "by_itself": sum(s.by_itself for s in studies),
        "seeds": len(studies),
        "optimum": opt,
        "slots": slots,
        "peak": max(s.peak for s in studies),
    }


def _n(value: float) -> str:
    return "—" if math.isinf(value) else f"{value:g}"


def print_table(
    summaries: list[dict[str, Any]],
    budget: int,
    slots: int = 1,
    skipped: tuple[tuple[str, str], ...] = (),
) -> None:
    """The table; ``skipped``: (case, strategy) pairs not run (a row says why)."""
    head = (
        "| case | strategy | to 1 %: median / p90 | "
        + ("rounds: median / p90 | " if slots > 1 else "")
        + "never | stopped after: median / p90 | by itself | "
        + " | ".join(f"pick@{n}" for n in PICKS_AT if n <= budget)
        + " | final | < floor | runs | bench s | calibration |"
    )
    columns = head.count("|") - 1
    print(head)
    print("|" + "---|" * columns)
    rows = [(s["case"], s["strategy"], s) for s in summaries]
    rows += [(case, strategy, None) for case, strategy in skipped]
    order = {case: i for i, case in enumerate(dict.fromkeys(r[0] for r in rows))}
    for case, strategy, s in sorted(rows, key=lambda r: order[r[0]]):
        if s is None:
            note = "not run: the full space (1.6 M candidates) is too big to walk"
            print(f"| {case} | {strategy} | {note} |" + " |" * (columns - 3))
            continue
        picks = " | ".join(f"{100 * s['at'][n]:.1f} %" for n in PICKS_AT if n <= budget)
        rounds = f"{_n(s['median'] / slots)} / {_n(s['p90'] / slots)} | " if slots > 1 else ""
        print(
            f"| {s['case']} | {s['strategy']} | {_n(s['median'])} / {_n(s['p90'])} | {rounds}"
            f"{s['never']}/{s['seeds']} | {s['stopped']:g} / {s['stopped_p90']:g} | "
            f"{s['by_itself']}/{s['seeds']} | {picks} | {s['final']}/{s['seeds']} | "
            f"{s['below_floor']} | {s['runs']:.1f} | {s['bench_s']:.0f} | "
            f"{_calibration(s['calibration'])} |"
        )
    print()
    if slots > 1:
        peak = max(s["peak"] for s in summaries)
        print(f"{slots} slots (most trials at once: {peak}); rounds = restarts / {slots}")
    for case in dict.fromkeys(r[0] for r in rows):
        value, best = optimum_at(case)
        truth = "recorded mean" if case in REAL_CASES else "true, noise-free"
        print(f"optimum {case}: {value:.2f} tok/s ({truth}) at {best.label()}; "
              f"floor {floor_of(case):.2f}")  # fmt: skip
        if case in REAL_CASES:
            print(f"  {case}: {outside.landscape_shape(REAL_CASES[case])}")
    named = {c.partition("/")[0] for c in dict.fromkeys(r[0] for r in rows) if c in OUTSIDE_CASES}
    for line in outside.describe():
        if line.partition(":")[0] in named:
            print(f"  outside the form, {line}")
    print(
        "calibration: of the seeds whose study stopped by itself on P(a rival beats the pick "
        "by > 1 %) < 20 %, those whose pick the optimum truly beats by more than 1 %"
    )


def _calibration(pair: tuple[int, int]) -> str:
    wrong, said = pair
    return f"{wrong}/{said}" if said else "—"


def per_seed_lines(case: str, studies: list[StudyRun]) -> list[str]:
    """One line per seed: first restart within 1 %, where it stopped, its final share of the
    optimum, restarts truly below the floor, and each change of the pick (restart: label
    share)."""
    opt = optimum(case)
    lines = []
    for s in sorted(studies, key=lambda s: s.seed):
        hit = next((i + 1 for i, v in enumerate(s.picks) if v >= 0.99 * opt), None)
        dips = [i + 1 for i, v in enumerate(s.picks) if i > 0 and v < s.floor - 1e-9]
        path, last = [], None
        for i, (value, label) in enumerate(zip(s.picks, s.pick_labels, strict=False)):
            if label != last:
                path.append(f"{i + 1}: {label} {100 * value / opt:.1f} %")
                last = label
        said = f" (P {s.stop_p:.1f} %)" if s.by_itself and s.stop_p is not None else ""
        lines.append(
            f"seed {s.seed}: to 1 % {hit if hit else 'never'}, stopped after {s.used}{said}, "
            f"final {100 * s.picks[-1] / opt:.1f} %"
            + (f", below floor at {dips}" if dips else "")
            + " | "
            + "; ".join(path)
        )
    return lines


def print_per_seed(grouped: dict[tuple[str, str], list[StudyRun]]) -> None:
    for (case, strategy), studies in grouped.items():
        print(f"\n{case} / {strategy}, per seed:")
        for line in per_seed_lines(case, studies):
            print(f"  {line}")


def _first_within(
    rows: list[tuple[float, ...]], opts: list[float], loads: list[int]
) -> int | None:
    """The first restart count whose picks are within 1 % of the optimum at every load in
    ``loads`` (indices), or None."""
    return next(
        (n + 1 for n, row in enumerate(rows) if all(row[j] >= 0.99 * opts[j] for j in loads)),
        None,
    )


def print_ladder(grouped: dict[tuple[str, str], list[StudyRun]]) -> None:
    """The multi-load cases' table: restarts until the best per load (the report's pick for the
    objective, its per-scenario best for the other loads, what ``adaptive_tiers.json`` is built
    from) is within 1 % of the true best at every load, and at each load alone."""
    ladders = [(k, v) for k, v in grouped.items() if k[0] in LADDER_CASES]
    for case in dict.fromkeys(k[0] for k, _ in ladders):
        loads = LADDER_CASES[case]
        opts = [optimum_at_load(case, c)[0] for c in loads]
        print(f"\nPer load ({case}): restarts until the best per load is within 1 % of the true "
              "best per load (median / p90; never: seeds that never get there)")  # fmt: skip
        head = ("| case | strategy | every load: median / p90 | never | "
                + " | ".join(f"c{c}: median / never" for c in loads)
                + " | final, every load |")  # fmt: skip
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for (c_, strategy), studies in ladders:
            if c_ != case:
                continue
            every = [_first_within(list(s.load_picks), opts, list(range(len(loads))))
                     for s in studies]  # fmt: skip
            ranked = sorted(h if h is not None else math.inf for h in every)
            per_load = []
            for j in range(len(loads)):
                hits = [_first_within(list(s.load_picks), opts, [j]) for s in studies]
                ranked_j = sorted(h if h is not None else math.inf for h in hits)
                per_load.append(f"{_n(statistics.median(ranked_j))} / "
                                f"{sum(h is None for h in hits)}")  # fmt: skip
            final = sum(all(s.load_picks[-1][j] >= 0.99 * opts[j] for j in range(len(loads)))
                        for s in studies)  # fmt: skip
            print(f"| {case} | {strategy} | {_n(statistics.median(ranked))} / "
                  f"{_n(_pct(ranked, 0.9))} | {sum(h is None for h in every)}/{len(studies)} | "
                  + " | ".join(per_load) + f" | {final}/{len(studies)} |")  # fmt: skip
        for c, opt in zip(loads, opts, strict=True):
            print(f"optimum {case} c{c}: {opt:.2f} tok/s (true, noise-free) at "
                  f"{optimum_at_load(case, c)[1].label()}")  # fmt: skip


def print_plan(grouped: dict[tuple[str, str], list[StudyRun]]) -> None:
    """The multi-load cases' plan table: the verified plan (the study's own verification trial)
    against the best per-load plan's true value and against the static pick's."""
    ladders = [(k, v) for k, v in grouped.items() if k[0] in LADDER_CASES]
    for case in dict.fromkeys(k[0] for k, _ in ladders):
        loads = LADDER_CASES[case]
        opts, best = best_plan_at(case)
        print(f"\nThe plan ({case}): the verified plan (the study's verification trial) against "
              "the best per-load plan's true value (within 1 % at every load) and the static "
              "pick's (worse: below it by more than 1 % at some load)")  # fmt: skip
        head = ("| case | strategy | verified within 1 %: at restart median / p90 | never | "
                "built within 1 % after: median / never | final | worse than static | "
                "recommended | recommended and worse | "
                + " | ".join(f"plan / static c{c}" for c in loads) + " |")  # fmt: skip
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for (c_, strategy), studies in ladders:
            if c_ != case:
                continue
            every = range(len(loads))
            ok = [bool(s.verified) and all(s.verified[j] >= 0.99 * opts[j] for j in every)
                  for s in studies]  # fmt: skip
            at = sorted(s.verified_at if good else math.inf
                        for s, good in zip(studies, ok, strict=True))  # fmt: skip
            built = []
            for s in studies:
                rows = [row if row else (0.0,) * len(loads) for row in s.plan_picks]
                hit = _first_within(rows, opts, list(every))
                built.append(hit + 1 if hit is not None else math.inf)  # + its verification
            worse = [bool(s.verified) and bool(s.static_final)
                     and any(s.verified[j] < 0.99 * s.static_final[j] for j in every)
                     for s in studies]  # fmt: skip
            rec = [s.recommended for s in studies]
            both = sum(r and w for r, w in zip(rec, worse, strict=True))
            # The verified plan's true value over the static pick's, per load (median).
            pairs = [s for s in studies if s.verified and s.static_final]
            ratios = [
                f"{statistics.median(s.verified[j] / s.static_final[j] for s in pairs):.3f}"
                if pairs
                else "—"
                for j in every
            ]
            n = len(studies)
            print(f"| {case} | {strategy} | {_n(statistics.median(at))} / {_n(_pct(at, 0.9))} | "
                  f"{sum(not g for g in ok)}/{n} | {_n(statistics.median(sorted(built)))} / "
                  f"{sum(math.isinf(b) for b in built)} | {sum(ok)}/{n} | {sum(worse)}/{n} | "
                  f"{sum(rec)}/{n} | {both}/{n} | " + " | ".join(ratios) + " |")  # fmt: skip
        for c, opt in zip(loads, opts, strict=True):
            print(f"best plan {case} c{c}: {opt:.2f} tok/s (true, noise-free, adaptive's cost "
                  f"included) at {best.steps_at(c)} steps")  # fmt: skip
        print(f"best plan {case}: {best.candidate().label()}")


def print_goodput(grouped: dict[tuple[str, str], list[StudyRun]]) -> None:
    """The goodput cases' table: seeds whose final pick truly meets the SLO (its noise-free
    latency at the load), seeds whose pick measured as meeting it, and the final pick's true
    goodput against the best configuration that truly meets it."""
    cases = [(k, v) for k, v in grouped.items() if k[0] in GOODPUT_CASES]
    for case in dict.fromkeys(k[0] for k, _ in cases):
        load = GOODPUT_CASES[case]
        opt, best = optimum_at(case)
        feasible = sum(truly_meets_slo(case, c) for c in ladder_candidates(case))
        slo = ", ".join(f"{k} {v:g}" for k, v in GOODPUT_SLO.items())
        print(f"\nGoodput ({case}): study.objective goodput at c{load} under study.slo {slo}; "
              f"{feasible} of {len(ladder_candidates(case))} distinct configurations truly "
              "meet it (noise-free latency at the load)")  # fmt: skip
        print("| case | strategy | final pick truly meets the SLO | measured as meeting it | "
              "final pick's true goodput: median / min |")  # fmt: skip
        print("|---|---|---|---|---|")
        for (c_, strategy), studies in cases:
            if c_ != case:
                continue
            finals = [s.picks[-1] / opt for s in studies]
            print(f"| {case} | {strategy} | {sum(bool(s.final_meets) for s in studies)}"
                  f"/{len(studies)} | {sum(bool(s.final_feasible) for s in studies)}"
                  f"/{len(studies)} | {100 * statistics.median(finals):.1f} % / "
                  f"{100 * min(finals):.1f} % |")  # fmt: skip
        ttft, itl = true_latency_at(case, best, load)
        print(f"best that truly meets it: {opt:.2f} tok/s at c{load} (true, noise-free) at "
              f"{best.label()}: TTFT {ttft:.1f} ms, p99 gap {itl:.2f} ms")  # fmt: skip


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
                                  equivalent=load_equivalence(cfg.out_dir),
                                  belief=believes(cfg))  # fmt: skip
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
    p.add_argument(
        "--first-seed", type=int, default=0,
        help="study seeds run from this one (20: seeds 20-39, none the search was tuned on)",
    )  # fmt: skip
    p.add_argument("--budget", type=int, default=40)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--strategies", default="structured,tpe,random")
    p.add_argument("--cases", default=",".join(DEFAULT_CASES))
    p.add_argument(
        "--noise-scale", type=float, default=1.0,
        help="multiply every noise term of each case's profile (sigma_start, sigma_accept, "
        "sigma_time)",
    )  # fmt: skip
    p.add_argument(
        "--start-noise-scale", type=float, default=1.0,
        help="multiply each case's between-start noise (sigma_start), on top of --noise-scale",
    )  # fmt: skip
    p.add_argument("--slots", type=int, default=1, help="trials at once (simulated slots)")
    p.add_argument(
        "--confirm", action="store_true", help="also run one study through the HTTP twin"
    )
    p.add_argument("--confirm-budget", type=int, default=12)
    p.add_argument(
        "--landscapes", default=None,
        help="a folder of recorded landscapes (cpu-<drafter>.parquet): real/<drafter> cases "
        "(default benchmarks/landscapes/)",
    )  # fmt: skip
    p.add_argument(
        "--per-seed", action="store_true",
        help="also print each seed's pick path: restart, pick, its true share of the optimum",
    )  # fmt: skip
    return p


def plan(
    cases: list[str],
    strategies: list[str],
    seeds: int,
    budget: int,
    slots: int = 1,
    noise: tuple[float, float] = (1.0, 1.0),
    first_seed: int = 0,
) -> tuple[list[Task], tuple[tuple[str, str], ...]]:
    """The studies to run, and the (case, strategy) pairs left out: a strategy that walks the
    whole space is not run on the full space."""
    skipped = tuple((c, st) for c in cases for st in strategies
                    if st in WALKS_THE_SPACE and FULL_SPACE in CASES[c])  # fmt: skip
    tasks = [(c, st, seed, budget, slots, noise) for c in cases for st in strategies
             if (c, st) not in skipped
             for seed in range(first_seed, first_seed + seeds)]  # fmt: skip
    return tasks, skipped


def _quiet_worker() -> None:
    """Ctrl-C reaches the whole process group: the parent stops the pool, the workers keep
    quiet (no traceback from each of them)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_all(tasks: list[Any], jobs: int, t0: float) -> list[Any]:
    """Every study, in order, with a progress line on stderr at each tenth of them."""
    runs: list[Any] = []
    step = max(1, len(tasks) // 10)
    with multiprocessing.get_context("spawn").Pool(jobs, initializer=_quiet_worker) as pool:
        for run in pool.imap(_task, tasks, chunksize=1):
            runs.append(run)
            if len(runs) % step == 0 and len(runs) < len(tasks):
                print(f"  {len(runs)}/{len(tasks)} studies, {time.monotonic() - t0:.0f} s",
                      file=sys.stderr, flush=True)  # fmt: skip
    return runs


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:
        print("interrupted: no table (the studies run in memory; run it again)", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `| head`: the reader has gone; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor at exit
        return 0


def _main(argv: list[str] | None) -> int:
    args = parser().parse_args(argv)
    if args.landscapes is not None:
        if not outside.landscape_files(args.landscapes):
            print(f"error: --landscapes: no cpu-*.parquet in {args.landscapes!r}", file=sys.stderr)
            return 2
        os.environ["RAYSPEC_LANDSCAPES"] = os.path.abspath(args.landscapes)  # the workers'
        register_landscapes(args.landscapes)
    strategies = args.strategies.split(",")
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        print(f"error: unknown case {unknown[0]!r}; choose from {', '.join(CASES)}",
              file=sys.stderr)  # fmt: skip
        return 2
    odd = [st for st in strategies if st not in STRATEGIES]
    if odd:
        print(f"error: unknown strategy {odd[0]!r}; choose from {', '.join(STRATEGIES)}",
              file=sys.stderr)  # fmt: skip
        return 2
    if args.slots < 1:
        print("error: --slots must be at least 1", file=sys.stderr)
        return 2
    for flag, value in (("--noise-scale", args.noise_scale),
                        ("--start-noise-scale", args.start_noise_scale)):  # fmt: skip
        if not (math.isfinite(value) and value >= 0):
            print(f"error: {flag} must be a number >= 0, got {value:g}", file=sys.stderr)
            return 2
    noise = (args.start_noise_scale, args.noise_scale)
    if args.first_seed < 0:
        print(f"error: --first-seed must be >= 0, got {args.first_seed}", file=sys.stderr)
        return 2
    tasks, skipped = plan(
        cases, strategies, args.seeds, args.budget, args.slots, noise, args.first_seed
    )
    t0 = time.monotonic()
    scaled = "" if noise == (1.0, 1.0) else (
        f", noise x{args.noise_scale:g}, start noise x{args.start_noise_scale:g} on top"
    )  # fmt: skip
    print(f"{len(tasks)} studies ({len(cases)} cases x {len(strategies)} strategies x "
          f"{args.seeds} seeds"
          + (f" from {args.first_seed}" if args.first_seed else "")
          + f", {args.budget} restarts each"
          + (f", {args.slots} slots" if args.slots > 1 else "") + scaled
          + f") on {args.jobs} processes ...",
          flush=True)  # fmt: skip
    runs = _run_all(tasks, args.jobs, t0)
    grouped: dict[tuple[str, str], list[StudyRun]] = {}
    errors = [r for r in runs if isinstance(r, str)]
    for r in runs:
        if not isinstance(r, str):
            grouped.setdefault((r.case, r.strategy), []).append(r)
    summaries = [summarize(c, st, grouped[(c, st)], args.budget, args.slots) for c in cases
                 for st in strategies if grouped.get((c, st))]  # fmt: skip
    print(f"done in {time.monotonic() - t0:.0f} s\n")
    print_table(summaries, args.budget, args.slots, skipped)
    print_ladder(grouped)
    print_plan(grouped)
    print_goodput(grouped)
    if args.per_seed:
        print_per_seed(grouped)
    for error in errors:
        print(f"ERROR {error}")
    if args.confirm:
        confirm(0, args.confirm_budget)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
