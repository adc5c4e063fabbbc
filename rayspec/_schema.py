"""The experiment's typed schema: every key, its type and its default.

The sections are dataclasses OmegaConf merges a YAML file over (:func:`rayspec._config.load_config`
reads them; :mod:`rayspec._validate` checks what types alone cannot). Everything downstream takes
the typed :class:`ExperimentConfig`.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from dataclasses import field
from typing import Any

from omegaconf import MISSING
from omegaconf import OmegaConf

__all__ = [
    "ADAPTIVE_SUFFIX",
    "BenchConfig",
    "ClusterConfig",
    "Engine",
    "ExperimentConfig",
    "LadderConfig",
    "NcclScreenConfig",
    "OBJECTIVES",
    "OVERLAP_CHOICES",
    "OutputConfig",
    "SPEC_ALGORITHMS",
    "SPEC_MODES",
    "SLO_KEYS",
    "SPEC_OFF",
    "SCHEDULER_KNOBS",
    "Sampler",
    "ScenarioConfig",
    "SchedulerSpace",
    "SearchConfig",
    "ServerConfig",
    "SpeculativeSpace",
    "StudyConfig",
    "TwinConfig",
    "UNSET",
]

UNSET = "unset"
"""The search-space choice that leaves a variable out of the server's environment."""

SPEC_OFF = "off"
SPEC_ALGORITHMS = ("EAGLE3", "EAGLE")
# SGLang's adaptive speculative decoding (--speculative-adaptive): "<algorithm>-adaptive".
ADAPTIVE_SUFFIX = "-adaptive"
SPEC_MODES = (*SPEC_ALGORITHMS, *(f"{a}{ADAPTIVE_SUFFIX}" for a in SPEC_ALGORITHMS))
OVERLAP_CHOICES = ("on", "off")

# Per-trial metrics a study can maximise (output tok/s of the objective scenario).
OBJECTIVES = ("tok_s_mean", "tok_s_min", "tok_s_ci95_low", "tok_s_peak", "goodput")
# study.slo's keys: the p99 over a trial's requests each must stay within (ms).
SLO_KEYS = ("ttft_p99_ms", "itl_p99_ms")


class Engine(str, enum.Enum):
    sglang = "sglang"
    twin = "twin"


class Sampler(str, enum.Enum):
    structured = "structured"  # rayspec's search (search/_structured.py); Optuna records it
    belief = "belief"  # one belief, one rule (search/_valued.py); Optuna records it
    tpe = "tpe"
    random = "random"
    grid = "grid"


@dataclass
class StudyConfig:
    """The Optuna study and its budget.

    The budget is counted in server launches (``max_restarts``): a reused result or a
    configuration refused before launch costs nothing. ``max_wall_s`` optionally bounds this
    invocation's wall time (no new trial starts after it); ``n_trials`` optionally caps the
    trials told to Optuna. ``storage`` empty means ``<out>/optuna.journal`` (a journal file
    optuna-dashboard opens). ``enqueue`` lists configurations tried first, after the baseline
    (no speculation, NCCL unset), each as ``{param: value}`` with the study's parameter names.
    """

    name: str = MISSING
    max_restarts: int = 30
    max_wall_s: float | None = None
    n_trials: int | None = None
    sampler: Sampler = Sampler.structured
    seed: int | None = 0
    storage: str = ""
    n_startup_trials: int = 6
    enqueue: list[dict[str, Any]] = field(default_factory=list)
    # The objective: a per-trial metric of one scenario ("" = the first), maximised.
    objective: str = "tok_s_mean"
    objective_scenario: str = ""
    # A latency SLO (any of SLO_KEYS, ms): a trial whose p99 over its requests misses one is
    # infeasible (an Optuna constraint; never picked while a feasible one exists), and
    # objective goodput counts only the tokens of the requests that met it (bench/_slo.py).
    slo: dict[str, float] = field(default_factory=dict)
    # Stop a trial after a run once it cannot beat the incumbent (one-sided 99 % bound).
    pruning: bool = True
    prune_min_runs: int = 1
    # Significance level of the comparisons against the baseline and the incumbent.
    alpha: float = 0.05
    # 0: the pick is the best lower bound (posterior mean - 1 sd). Above 0 (an explicit cost
    # objective): the cheapest configuration (fewer draft tokens, then fewer steps) within this
    # fraction of it.
    pick_margin: float = 0.0
    # Relative sd of a configuration's throughput between server starts (clocks, thermals,
    # placement): the median of a weak prior (a factor of 3 is one sd) that the configurations
    # started more than once update.
    start_noise: float = 0.01
    # The belief search (sampler belief) stops once no restart is expected to raise the
    # deployed throughput by this much (relative: 0.0025 is 0.25 %); lower it (or 0: spend the
    # whole budget) to go on with a study that stopped by itself.
    stop_gain: float = 0.0025
    # The accept length your drafter is known to give (e.g. its best chain's): a trial far below
    # it is flagged (a drafter wired to the wrong layers). Empty: judged by the best chain.
    expect_accept_length: float | None = None
    # With a closed-loop ladder and an SGLang with --speculative-adaptive: server starts of the
    # per-load plan (adaptive tiers) measured at every load after the search, kept out of the
    # search's budget (study.max_restarts includes them). 0: no verification.
    verify_plan: int = 1


@dataclass
class ClusterConfig:
    """Where trials run. An empty address starts a private local Ray (the embedded default)."""

    address: str = ""
    num_cpus: int | None = None
    # Local cluster only. None: Ray detects real GPUs; the twin declares tp_size fake GPUs.
    num_gpus: int | None = None
    include_dashboard: bool = True
    dashboard_host: str = "127.0.0.1"
    dashboard_port: int = 8265
    # Trials at once; 0: as many as the cluster holds (per node, its GPUs // tp_size).
    max_concurrent_trials: int = 1
    # A Ray custom resource every usable node declares (e.g. "h200": `ray start --resources
    # '{"h200": 1}'`); trials run only on such nodes. "": any node with the GPUs.
    node_resource: str = ""
    # How long a trial (or the NCCL screen) may wait for its GPUs on one node before it is
    # failed and the study stops: the room counted may be held by a job outside the study.
    # 0: wait for ever.
    placement_timeout_s: float = 600.0


@dataclass
class TwinConfig:
    """Options of the digital twin (``server.engine: twin``); passed as ``--twin-*`` flags."""

    profile: str = "kimi-k2.5-tp8-pcie"
    seed: int | None = None  # None: derived from study.seed and the trial number
    startup_s: float = 1.0
    fault: str = ""
    version: str = "0.5.23"


@dataclass
class ServerConfig:
    """How each trial's server is launched; the searched settings come from ``search``."""

    engine: Engine = Engine.sglang
    model_path: str = ""
    draft_model_path: str = ""
    tp_size: int = 8
    host: str = "127.0.0.1"
    port: int = 30000  # concurrent trials on one node use port, port+1, ...
    attention_backend: str = ""
    max_running_requests: int = 48
    cuda_graph_max_bs: int | None = None  # the decode graph cap; flag name by sglang_version
    mem_fraction_static: float | None = None
    trust_remote_code: bool = False
    enable_metrics: bool = True
    sglang_version: str = "0.5.23"
    python: str = ""  # interpreter that runs the server; empty: the one running rayspec
    extra_flags: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 1800.0
    stop_timeout_s: float = 30.0
    allow_nvlink_multicast: bool = False
    # NCCL_* names rayspec does not know that your NCCL reads (engine sglang refuses an
    # unknown one otherwise: NCCL ignores a misspelt variable silently).
    extra_nccl_vars: list[str] = field(default_factory=list)
    twin: TwinConfig = field(default_factory=TwinConfig)

    @property
    def version(self) -> str:
        """The SGLang version whose rules apply: the real one's, or the one the twin emulates."""
        return self.sglang_version if self.engine is Engine.sglang else self.twin.version


@dataclass
class SpeculativeSpace:
    """EAGLE-3 choices.

    ``modes`` holds ``off`` (the baseline), algorithm names (static steps/topk/draft tokens)
    and/or ``EAGLE3-adaptive`` (SGLang's adaptive steps, topk 1: one point of the space).
    ``overlap``: ``[on]`` keeps the speculative overlap scheduler on; ``[on, off]`` also tries
    it off for topk-1 configurations.
    """

    modes: list[str] = field(default_factory=lambda: [SPEC_OFF, "EAGLE3"])
    num_steps: list[int] = field(default_factory=lambda: [1, 2, 3, 4, 5, 6])
    eagle_topk: list[int] = field(default_factory=lambda: [1, 2, 4])
    num_draft_tokens: list[int] = field(default_factory=lambda: [2, 3, 4, 6, 8])
    overlap: list[str] = field(default_factory=lambda: ["on"])


# search.scheduler's keys: SGLang's scheduler knobs that interact with speculation, each the
# server flag the candidate's value replaces (docs/sglang.md, *Scheduler knobs*).
SCHEDULER_KNOBS = ("max_running_requests", "cuda_graph_max_bs", "chunked_prefill_size")


@dataclass
class SchedulerSpace:
    """SGLang's scheduler knobs to search (an empty list: the server's value, not searched).

    ``max_running_requests`` caps the running batch (the rest queue); ``cuda_graph_max_bs`` is
    the largest decode batch run as a CUDA graph (larger ones run eagerly; SGLang clamps it to
    the running cap); ``chunked_prefill_size`` is the most prompt tokens one prefill forward
    takes (-1: chunking off). A candidate that leaves a knob out runs the server's value.
    """

    max_running_requests: list[int] = field(default_factory=list)
    cuda_graph_max_bs: list[int] = field(default_factory=list)
    chunked_prefill_size: list[int] = field(default_factory=list)


@dataclass
class NcclScreenConfig:
    """The NCCL screen: all-reduce latency of each NCCL set before any restart.

    Every set of ``search.nccl`` is measured when there are at most ``max_sets``; otherwise a
    coordinate descent from NCCL's defaults. Sets within ``tolerance`` of each other at every
    message size are one point. ``hidden_size`` (the model's) sets the message sizes; empty:
    from the twin profile, or the model's config.json.
    """

    enabled: bool = True
    max_sets: int = 256
    timeout_s: float = 120.0
    tolerance: float = 0.03
    hidden_size: int | None = None
    dtype_bytes: int = 2


@dataclass
class SearchConfig:
    """The search space. ``unset`` is always a choice of every NCCL variable (added if absent).

    ``nccl`` maps each searched variable to its values; a file's mapping replaces the default
    (empty) one, so only what the experiment lists is searched. ``flags`` maps a server flag to
    its choices; a value ``on``/``off`` makes it a switch. ``scheduler`` lists values of
    SGLang's scheduler knobs (:class:`SchedulerSpace`).
    """

    nccl: dict[str, list[str]] = field(default_factory=dict)
    speculative: SpeculativeSpace = field(default_factory=SpeculativeSpace)
    flags: dict[str, list[str]] = field(default_factory=dict)
    scheduler: SchedulerSpace = field(default_factory=SchedulerSpace)
    nccl_screen: NcclScreenConfig = field(default_factory=NcclScreenConfig)


@dataclass
class ScenarioConfig:
    """One load shape; empty ``bench.scenarios`` means one from the top-level bench keys.

    ``input_len``/``output_len`` are optional ``[low, high]`` ranges (words / tokens) drawn per
    request, deterministically; ``request_rate`` (requests/s, Poisson) is optional too.
    """

    name: str = "single"
    concurrency: int = 1
    requests_per_run: int = 1
    max_tokens: int = 500
    input_len: list[int] | None = None
    output_len: list[int] | None = None
    request_rate: float | None = None


class BenchApi(str, enum.Enum):
    generate = "generate"  # SGLang's native /generate (the twin's simulated clock, output ids)
    chat = "chat"  # the OpenAI /v1/chat/completions stream, as chat clients send


@dataclass
class LadderConfig:
    """A load ladder: one scenario per rung, so one key sweeps the loads a server will see.

    ``concurrency`` rungs are closed loops named ``c<N>`` (N streams, N requests a run);
    ``request_rate`` rungs are Poisson arrivals named ``r<rate>`` (requests/s), at most
    ``max_concurrency`` in flight, ``requests_per_run`` requests a run.
    """

    concurrency: list[int] = field(default_factory=list)
    request_rate: list[float] = field(default_factory=list)
    requests_per_run: int | None = None  # default: N for c<N>, 32 for a rate rung
    max_concurrency: int = 64  # a rate rung's cap on requests in flight


@dataclass
class BenchConfig:
    """The measurement protocol; the default is the field's: 1 warm-up, 5 runs of 500 tokens."""

    warmup: int = 1
    repeats: int = 5
    # A result close to the best keeps measuring on the same server up to this many runs
    # (more runs cost seconds, a restart minutes); empty: 8 x repeats; = repeats: never.
    max_repeats: int | None = None
    max_tokens: int = 500
    # The correctness gate: each trial's greedy output against the baseline's; most outputs
    # differing within the first gate_tokens tokens fail the trial as wrong_output.
    check_outputs: bool = True
    gate_tokens: int = 32
    concurrency: int = 1
    prompts: str = "default"
    api: BenchApi = BenchApi.generate
    temperature: float = 0.0
    read_timeout_s: float = 60.0
    request_timeout_s: float = 900.0
    scenarios: list[ScenarioConfig] = field(default_factory=list)
    ladder: LadderConfig = field(default_factory=LadderConfig)


@dataclass
class OutputConfig:
    """Everything of a study goes to ``<dir>/<study.name>/``."""

    dir: str = "runs"


@dataclass
class ExperimentConfig:
    study: StudyConfig = field(default_factory=StudyConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    output: OutputConfig = field(default_factory=OutputConfig)

    @property
    def out_dir(self) -> str:
        return os.path.join(self.output.dir, self.study.name)

    @property
    def storage_url(self) -> str:
        return self.study.storage or os.path.join(self.out_dir, "optuna.journal")

    @property
    def max_repeats(self) -> int:
        """The runs a close result may extend to (``bench.max_repeats``, default 8 x repeats)."""
        if self.bench.max_repeats is not None:
            return max(self.bench.max_repeats, self.bench.repeats)
        return 8 * self.bench.repeats

    def scenarios(self) -> list[ScenarioConfig]:
        """The load scenarios, the objective's first (so pruning can stop the rest)."""
        bench = self.bench
        declared = bench.scenarios or ladder_scenarios(bench.ladder, bench.max_tokens)
        if declared:
            first = self.study.objective_scenario or declared[0].name
            return sorted(declared, key=lambda sc: sc.name != first)
        return [
            ScenarioConfig(
                name="single" if self.bench.concurrency == 1 else f"c{self.bench.concurrency}",
                concurrency=self.bench.concurrency,
                requests_per_run=self.bench.concurrency,
                max_tokens=self.bench.max_tokens,
            )
        ]

    def to_yaml(self) -> str:
        return OmegaConf.to_yaml(OmegaConf.structured(self))


_RATE_RUNG_REQUESTS = 32  # enough arrivals a run for a Poisson rung's percentiles to mean much


def ladder_scenarios(ladder: LadderConfig, max_tokens: int) -> list[ScenarioConfig]:
    """``bench.ladder``'s rungs as scenarios, concurrency rungs first, in the order given."""
    closed = [
        ScenarioConfig(
            name=f"c{n}", concurrency=n, requests_per_run=ladder.requests_per_run or n,
            max_tokens=max_tokens,
        )
        for n in ladder.concurrency
    ]  # fmt: skip
    poisson = [
        ScenarioConfig(
            name=rate_rung_name(rate), concurrency=ladder.max_concurrency,
            requests_per_run=ladder.requests_per_run or _RATE_RUNG_REQUESTS,
            max_tokens=max_tokens, request_rate=rate,
        )
        for rate in ladder.request_rate
    ]  # fmt: skip
    return closed + poisson


def rate_rung_name(rate: float) -> str:
    """``r2``, ``r0p5``: a scenario name of letters and digits for a rate rung."""
    return "r" + f"{rate:g}".replace(".", "p")
