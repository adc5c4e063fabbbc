"""Data that crosses an actor or module boundary: frozen dataclasses, never dicts."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

from rayspec._exceptions import NOT_THE_CONFIG
from rayspec._exceptions import FailureReason
from rayspec._plural import plural
from rayspec._text import one_line

DEFAULT_CATEGORY = "default"
"""The category of a prompt whose set names none (every prompt of a set without categories)."""

CATEGORY_METRICS: tuple[str, ...] = ("requests", "tok_s", "accept_length")
"""A trial's figures per prompt category (``bench.category_metrics``), each stored as
``category__<category>__<metric>`` (:func:`category_key`)."""


def category_key(category: str, metric: str) -> str:
    """The metric name of one category's figure, e.g. ``category__code__tok_s``."""
    return f"category__{category}__{metric}"


class TrialState(str, enum.Enum):
    """A trial's outcome, with Optuna's names (stored verbatim in Parquet's ``state``)."""

    COMPLETE = "COMPLETE"
    FAIL = "FAIL"
    PRUNED = "PRUNED"


class RunDecision(enum.Enum):
    """What a trial does after a measured run (the driver's answer to the trial).

    ``CONTINUE``: go on with the planned runs and stop there. ``EXTEND``: the result is close
    to the best, so measure past the plan (up to ``bench.max_repeats``): more runs on a started
    server are cheap, a restart is not. ``PRUNE``: stop now, it cannot beat the incumbent.
    """

    CONTINUE = "continue"
    EXTEND = "extend"
    PRUNE = "prune"


@dataclasses.dataclass(frozen=True)
class SpecSettings:
    """EAGLE-3 settings of one candidate, already normalised by SGLang's rules.

    ``num_draft_tokens`` includes the root/bonus position (SGLang's N). With ``eagle_topk == 1``
    it is always ``num_steps + 1``.

    ``adaptive``: SGLang's adaptive speculative decoding (``--speculative-adaptive``, topk 1):
    ``num_steps`` is then only where it starts; each batch-size tier moves among its candidate
    steps as acceptance goes. ``overlap``: False turns the speculative overlap scheduler
    (spec v2) off, which only topk 1 has; True leaves the engine's default.
    """

    algorithm: str
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int
    adaptive: bool = False
    overlap: bool = True

    @property
    def tree_capacity(self) -> int:
        """Draft nodes the tree generates: ``topk + (steps - 1) * topk**2``."""
        return self.eagle_topk + (self.num_steps - 1) * self.eagle_topk**2

    @property
    def holds_path(self) -> bool:
        """Whether a tree's budget holds its longest accepted path (``num_steps + 1`` tokens).

        SGLang 0.5.23 moves a tree's accepted path to the front of each request's block of
        ``num_draft_tokens`` at every verify and fails on a block shorter than the path (at
        the first verify: the server's warm-up). Such a tree's deeper steps could never all be
        accepted anyway: the same tree with fewer steps drafts less for the same tokens.
        """
        return self.eagle_topk == 1 or self.num_draft_tokens >= self.num_steps + 1

    @property
    def fits_tree(self) -> bool:
        """Whether SGLang can run the tree: pick ``num_draft_tokens - 1`` nodes out of it,
        and hold its accepted path (:attr:`holds_path`)."""
        return self.num_draft_tokens - 1 <= self.tree_capacity and self.holds_path

    def label(self) -> str:
        if self.adaptive:
            text = f"{self.algorithm} adaptive steps (from {self.num_steps})"
        else:
            text = (
                f"{self.algorithm} {plural(self.num_steps, 'step')}, topk {self.eagle_topk}, "
                f"{plural(self.num_draft_tokens, 'draft token')}"
            )
        return text if self.overlap else f"{text}, overlap off"


# Short names of the scheduler knobs in labels (progress lines, report rows).
_KNOB_LABELS = {
    "max_running_requests": "max-running",
    "cuda_graph_max_bs": "graph-bs",
    "chunked_prefill_size": "chunk",
}


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One point of the search space: what a trial launches.

    Attributes:
        nccl_env: the NCCL variables that are set, sorted by name (an "unset" choice is absent).
        spec: the speculative settings, or None for no speculation.
        flags: searched server flags as argv pieces, e.g. ``("--mem-fraction-static", "0.85")``.
        adaptive_tiers: an adaptive plan's tiers, batch size -> candidate steps (written as
            ``--speculative-adaptive-config``; empty: SGLang's default tiers or no adaptive).
            Only a plan's verification trial has them: they are not a point of the space.
        scheduler: searched scheduler knobs (``search.scheduler``), sorted by name, e.g.
            ``(("max_running_requests", 64),)``; a knob left out runs the server's value.
    """

    nccl_env: tuple[tuple[str, str], ...] = ()
    spec: SpecSettings | None = None
    flags: tuple[str, ...] = ()
    adaptive_tiers: tuple[tuple[int, tuple[int, ...]], ...] = ()
    scheduler: tuple[tuple[str, int], ...] = ()

    @property
    def env(self) -> dict[str, str]:
        return dict(self.nccl_env)

    @property
    def knobs(self) -> dict[str, int]:
        """The searched scheduler knobs by name (``max_running_requests`` ...)."""
        return dict(self.scheduler)

    @property
    def server_settings(self) -> tuple[str, ...]:
        """The searched flags and knobs as one identity (``flags`` then ``knob=value``): what
        a speculative surface holds fixed."""
        return (*self.flags, *(f"{k}={v}" for k, v in self.scheduler))

    def label(self) -> str:
        spec = self.spec.label() if self.spec else "no speculation"
        nccl = " ".join(f"{k.removeprefix('NCCL_')}={v}" for k, v in self.nccl_env)
        nccl = nccl or "NCCL default"
        flags = " " + " ".join(self.flags) if self.flags else ""
        if self.adaptive_tiers:
            tiers = " ".join(
                f"{bs}:{','.join(map(str, steps))}" for bs, steps in self.adaptive_tiers
            )
            spec = f"{spec}, tiers {tiers}"
        flags += "".join(f" {_KNOB_LABELS.get(k, k)}={v}" for k, v in self.scheduler)
        # One line whatever a value holds: labels go into progress lines and best.sh comments.
        return one_line(f"{spec}; {nccl}{flags}")


@dataclasses.dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one server process; built by a pure function.

    Attributes:
        argv: the full command, e.g. ``("python", "-m", "sglang.launch_server", ...)``. No shell.
        env: variables set on top of the actor's environment (NCCL values, fixed env).
        unset_env: variables removed from the inherited environment (an "unset" NCCL choice must
            not inherit a value from the node).
        host, port: where the server listens.
        log_path: file that receives the server's stdout and stderr.
        startup_timeout_s: how long readiness may take.
        engine: "sglang" or "twin"; recorded in every output.
        files: (flag, text) pairs: files the node writes before it starts the server, each
            passed as ``flag PATH`` after argv (``rayspec.server.with_files``), so a file's
            content never travels in a shell line (the adaptive tiers of a plan's trial).
    """

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    host: str
    port: int
    log_path: str
    startup_timeout_s: float
    engine: str
    unset_env: tuple[str, ...] = ()
    files: tuple[tuple[str, str], ...] = ()

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def env_dict(self) -> dict[str, str]:
        return dict(self.env)


@dataclasses.dataclass(frozen=True)
class RequestRecord:
    """One benchmark request as the client saw it.

    Times are client-side (``time.perf_counter`` differences) except the ``*_unix_s`` stamps,
    or, for a twin study on ``/generate``, on the twin's simulated clock (``ttft_ms``,
    ``itl_ms``, ``e2e_ms``; see :class:`~rayspec.bench.StreamClient`).
    ``accept_length`` is ``completion_tokens / spec_verify_ct`` of this request: run-scoped,
    not SGLang's lifetime average. ``accept_histogram`` is SGLang's
    ``spec_correct_drafts_histogram`` of this request: element ``i`` counts the verify steps
    that accepted ``i`` drafts (its length is the most accepted, plus one; it sums to
    ``spec_verify_ct``). ``ttft_ms`` is to the first chunk carrying tokens (the report's TTFT),
    ``ttft_text_ms`` to the first chunk with text (outside clients' TTFT; see
    :class:`~rayspec.bench.StreamClient`). ``category`` is the prompt's category in its set
    (``"default"`` for a set without categories). ``sim_start_s`` is the arrival of a
    twin-timed request of a closed
    loop on that clock (None otherwise). A failed request has ``failure`` (its class) and
    ``error`` (what happened); either alone is normalised to both at construction.
    """

    scenario: str
    run: int  # repeat index within the scenario; -1 for warm-up
    index: int  # request index within the run
    concurrency: int
    prompt_tokens: int
    completion_tokens: int
    ttft_ms: float
    e2e_ms: float
    itl_ms: tuple[float, ...]  # gap per token after the first (a chunk's gap is split evenly)
    start_unix_s: float
    spec_verify_ct: int | None = None
    accept_length: float | None = None
    error: str | None = None  # the failure's message
    output_ids: tuple[int, ...] | None = None  # the greedy output (the correctness gate)
    failure: FailureReason | None = None
    accept_histogram: tuple[int, ...] | None = None  # verify steps by drafts accepted
    category: str = DEFAULT_CATEGORY  # the prompt's category in its set (bench.prompts)
    # Seconds on the twin's simulated clock: under load the run's span is taken from these
    # (run_tok_s), so a twin run's throughput does not depend on the host's speed.
    sim_start_s: float | None = None
    # To the first chunk with non-empty text, as bench_serving, AIPerf and the openai client
    # time TTFT (ttft_ms, the report's, is to the first chunk carrying tokens); None: no text
    # came, or not measured (simulated requests, rows written before the column).
    ttft_text_ms: float | None = None

    def __post_init__(self) -> None:
        # Normalise once: the class is typed (text is accepted, as stored), and a message
        # without a class is unknown rather than silently successful.
        if self.failure is not None:
            object.__setattr__(self, "failure", FailureReason(self.failure))
            if self.error is None:
                object.__setattr__(self, "error", self.failure.value)
        elif self.error is not None:
            object.__setattr__(self, "failure", FailureReason.UNKNOWN)

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def output_tok_s(self) -> float:
        """Output tokens per second over the whole request (TTFT included)."""
        return self.completion_tokens / (self.e2e_ms / 1000.0) if self.e2e_ms > 0 else 0.0

    @property
    def tpot_ms(self) -> float:
        """Time per output token after the first."""
        n = self.completion_tokens - 1
        return (self.e2e_ms - self.ttft_ms) / n if n > 0 else 0.0


def accept_histogram(records: Iterable[RequestRecord]) -> tuple[int, ...] | None:
    """The verify steps of the measured successful requests (warm-up excluded), by drafts
    accepted: the element-wise sum of their ``accept_histogram`` (None if none has one).

    Example:
        >>> import dataclasses
        >>> r = RequestRecord("s", 0, 0, 1, 1, 4, 1.0, 2.0, (), 0.0, accept_histogram=(0, 2))
        >>> accept_histogram([r, dataclasses.replace(r, accept_histogram=(1, 0, 1))])
        (1, 2, 1)
    """
    total: list[int] = []
    for r in records:
        if r.run < 0 or not r.ok or not r.accept_histogram:
            continue
        total.extend([0] * (len(r.accept_histogram) - len(total)))
        for i, n in enumerate(r.accept_histogram):
            total[i] += n
    return tuple(total) if total else None


@dataclasses.dataclass(frozen=True)
class TrialResult:
    """What one trial produced, whatever its outcome.

    ``metrics`` holds float values only (tok_s_mean, tok_s_peak, accept_length, ...), so Parquet
    columns never change type.
    """

    trial: int
    state: TrialState
    value: float | None
    candidate: Candidate
    launch: LaunchSpec | None
    metrics: Mapping[str, float]
    requests: tuple[RequestRecord, ...]
    start_unix_s: float
    end_unix_s: float
    failure: FailureReason | None = None
    failure_detail: str = ""
    log_tail: str = ""
    server_info: str = ""  # JSON of /get_server_info, for cross-checks
    node: str = ""

    def __post_init__(self) -> None:
        # Normalise once: callers may pass Optuna's state names, and the stored failure, as
        # text (a row read back from Parquet or the journal).
        object.__setattr__(self, "state", TrialState(self.state))
        if self.failure is not None:
            object.__setattr__(self, "failure", FailureReason(self.failure))

    @property
    def costs_restart(self) -> bool:
        """Whether the trial spends one of the study's restarts (``study.max_restarts``): it
        launched a server and did not fail for the driver's or the cluster's sake (interrupted,
        node_lost: the configuration is tried again and the retry counts instead)."""
        return self.launch is not None and self.failure not in NOT_THE_CONFIG


@dataclasses.dataclass(frozen=True)
class TrialRecord:
    """One trial row of the store: what the trial produced and what the study knows of it.

    The driver writes one per trial (:meth:`~rayspec.store.BaseTrialStore.append_trial`);
    resume and the report read the same type back
    (:meth:`~rayspec.store.ParquetTrialStore.load_records`), so no caller parses row columns.

    Attributes:
        result: the trial's outcome (read back: ``launch`` holds the stored argv and
            environment; host, port and startup timeout are not stored and read as empty).
        params: the Optuna parameters; the candidate is ``SearchSpace.candidate(params)``.
        run_values: the objective's value per measured run (tok/s), computed once.
        candidate_key: :func:`~rayspec.search.canonical_key` of the candidate ("" unknown).
        note: why no server ran for it, e.g. ``reused the measurement of trial 3``.
        role: ``baseline``, ``enqueued[i]``, or "" (chosen by the search).
        reason: why the search chose it.
        repeat_of: a deliberate new start of that trial's configuration.
        restart: the study's server launch count at this trial (launched trials only).
        alarm: the acceptance alarm's hint, when it fired.
        accept_histogram: the stored ``accept_histogram`` column (None: not stored, or read
            from ``result.requests``; see :attr:`histogram`).
    """

    result: TrialResult
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    run_values: tuple[float, ...] = ()
    candidate_key: str = ""
    note: str = ""
    role: str = ""
    reason: str = ""
    repeat_of: int | None = None
    restart: int | None = None
    alarm: str = ""
    accept_histogram: tuple[int, ...] | None = None

    @property
    def trial(self) -> int:
        return self.result.trial

    @property
    def histogram(self) -> tuple[int, ...] | None:
        """Verify steps by drafts accepted: the stored column, else summed from the requests."""
        if self.accept_histogram is not None:
            return self.accept_histogram
        return accept_histogram(self.result.requests)

    @property
    def candidate(self) -> Candidate:
        return self.result.candidate

    @property
    def reused(self) -> bool:
        """Whether the trial repeated another trial's result (no server of its own)."""
        return bool(self.note)

    @property
    def launched(self) -> bool:
        """Whether the trial started a server that counts against the restart budget (not a
        reuse, not refused before launch, not interrupted or lost with its node: such a trial
        is tried again and counted then)."""
        return self.result.costs_restart and not self.reused
