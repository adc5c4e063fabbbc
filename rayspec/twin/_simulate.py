"""The twin without processes: one server start simulated in-process, request by request.

:class:`SimulatedServer` applies exactly what ``python -m rayspec.twin.server`` applies to the
same argv and environment (the twin's argument parser, SGLang's resolution rules, NCCL
resolution, the noise model seeded by ``--twin-seed``, the server's own warm-up request) and
then serves requests one at a time (batch 1) with the engine's draws: the same acceptance
multiplier and time factor per request, the same per-request cycle seeds, the same per-start
offset. Token counts and verify counts are identical to the HTTP twin's; times are the
schedule's (the HTTP twin adds its scheduling jitter and the client's overhead on top). Under
load, :meth:`SimulatedServer.serve` runs the HTTP twin's own scheduler on a virtual clock
(``rayspec/twin/_load.py``): the same batches, draws and seeds per request index.

It exists for what needs thousands of trials in seconds: the search-efficiency benchmark and the
search tests. It is not a stand-in for the twin server in a study (``server.engine: twin``
always launches the real process).

Example::

    server = SimulatedServer(launch.argv[3:], env)
    server.generate(prompt_tokens=40, max_new_tokens=500).e2e_ms
"""

from __future__ import annotations

import dataclasses
import io
import random
from collections.abc import Mapping
from collections.abc import Sequence

from rayspec._exceptions import FailureReason
from rayspec._exceptions import LaunchError
from rayspec.twin._adaptive import AdaptiveSteps
from rayspec.twin._args import parse_args
from rayspec.twin._engine import Engine
from rayspec.twin._errors import NcclError
from rayspec.twin._errors import NcclInitError
from rayspec.twin._load import LoadAsk
from rayspec.twin._load import LoadedRequest
from rayspec.twin._load import VirtualClock
from rayspec.twin._load import serve_load
from rayspec.twin._log import SglangLog
from rayspec.twin._model import PerfModel
from rayspec.twin._nccl import resolve_nccl
from rayspec.twin._noise import NoiseModel
from rayspec.twin._profile import Profile
from rayspec.twin._profile import load_profile
from rayspec.twin._resolve import resolve_server_args
from rayspec.twin._text import completion_ids
from rayspec.twin._text import corrupt_ids
from rayspec.twin._text import model_seed

__all__ = ["LoadAsk", "SimulatedRequest", "SimulatedServer", "SimulatedStartupError"]

# The twin server's own warm-up request before the ready line (server.py): its prompt is six
# words and it generates 8 tokens. It takes request index 0 and the first noise draw.
_WARMUP_PROMPT_TOKENS = 6
_WARMUP_TOKENS = 8
_CTX_PROBE = 1000.0  # any two contexts give the (exactly linear) KV slope of a cycle


class SimulatedStartupError(LaunchError):
    """The simulated server would not become ready.

    Attributes:
        reason: the :class:`~rayspec.FailureReason` the twin server's failure would be
            classified as (``nccl_init``, ``nccl_first_collective``, ``never_ready``,
            ``invalid_draft_tree``, ``argument_error``).
    """

    def __init__(self, reason: FailureReason, detail: str) -> None:
        super().__init__(detail, reason=reason)


@dataclasses.dataclass(frozen=True)
class SimulatedRequest:
    """One request as the twin would serve it at batch 1 (times in ms from its arrival)."""

    prompt_tokens: int
    completion_tokens: int
    verify_ct: int | None  # cycles (None without speculation)
    ttft_ms: float
    e2e_ms: float
    correct_drafts_histogram: tuple[int, ...] | None = None
    output_ids: tuple[int, ...] | None = None
    itl_ms: tuple[float, ...] = ()  # as the bench client splits each cycle's gap

    @property
    def accept_length(self) -> float | None:
        if not self.verify_ct:
            return None
        return self.completion_tokens / self.verify_ct


class SimulatedServer:
    """One simulated server start.

    Args:
        argv: the twin server's arguments (a launch's argv after ``python -m
            rayspec.twin.server``).
        env: the server's environment (NCCL variables).
        profile: overrides ``--twin-profile`` (e.g. a profile built in memory).

    Raises:
        SimulatedStartupError: the start fails the way the twin server would (bad NCCL
            variable, no usable algorithm, a hang, an impossible draft tree, bad flags).
    """

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        profile: Profile | None = None,
    ) -> None:
        try:
            ns = parse_args(list(argv))
        except SystemExit as exc:  # argparse: an unknown or ambiguous flag
            raise SimulatedStartupError(
                FailureReason.ARGUMENT_ERROR, f"bad flags: {exc}"
            ) from None
        self.profile = profile or load_profile(ns.twin_profile)
        try:
            res = resolve_server_args(
                ns, architecture=self.profile.model.architecture, env=dict(env)
            )
        except (ValueError, AssertionError, TypeError) as exc:
            raise SimulatedStartupError(
                FailureReason.ARGUMENT_ERROR, f"{type(exc).__name__}: {exc}"
            ) from exc
        full_env = {**env, **res.env_updates}
        try:
            nccl = resolve_nccl(full_env, self.profile)
        except NcclInitError as exc:
            raise SimulatedStartupError(FailureReason.NCCL_INIT, str(exc)) from exc
        if nccl.hang:
            raise SimulatedStartupError(
                FailureReason.NEVER_READY, "the first collective hangs (P2P)"
            )
        try:
            nccl.allreduce_us(self.profile.model.token_bytes)
        except NcclError as exc:
            raise SimulatedStartupError(FailureReason.NCCL_FIRST_COLLECTIVE, str(exc)) from exc
        self.spec = res.spec
        if res.tree_error:
            raise SimulatedStartupError(FailureReason.INVALID_DRAFT_TREE, res.tree_error)
        self.seed = int(ns.twin_seed)
        self.text_seed = model_seed(self.profile.name)
        self.corrupt = nccl.ll128_risk
        self.max_running = res.max_running_requests
        self.graph_max_bs = int(res.args["cuda_graph_max_bs_decode"])
        self.graph_enabled = bool(res.args.get("cuda_graph_decode_enabled", True))
        self.chunked_prefill_size = int(res.args["chunked_prefill_size"])
        self.max_prefill_tokens = int(ns.max_prefill_tokens)
        self.version: tuple[int, int, int] = ns.twin_version_tuple
        self.tp_size = int(ns.tp_size)
        self.model = PerfModel(self.profile, nccl, self.spec)
        self.noise = NoiseModel(
            self.profile.noise, random.Random(self.seed), speculative=self.spec is not None
        )
        self._index = 0
        self.adaptive = (
            AdaptiveSteps(self.spec.num_steps, res.adaptive_tiers)
            if self.spec is not None and res.adaptive_tiers is not None
            else None
        )
        self._costs: dict[int, tuple[PerfModel, float, float]] = {}
        if not ns.skip_server_warmup:
            self.generate(_WARMUP_PROMPT_TOKENS, _WARMUP_TOKENS)

    def _cost(self) -> tuple[PerfModel, float, float]:
        """The model of the next cycle (adaptive: its tier's steps), its cost at ctx 0, slope."""
        steps = self.adaptive.steps_for(1) if self.adaptive is not None else -1
        cost = self._costs.get(steps)
        if cost is None:
            model = self.model if steps < 0 else self.model.with_steps(steps)
            graph = self.graph_enabled and self.graph_max_bs >= 1
            base = model.step_ms(1, 0.0, graph=graph)
            slope = (model.step_ms(1, _CTX_PROBE, graph=graph) - base) / _CTX_PROBE
            cost = self._costs[steps] = (model, base, slope)
        return cost

    def generate(
        self,
        prompt_tokens: int,
        max_new_tokens: int,
        prompt: str | None = None,
        category: str | None = None,
    ) -> SimulatedRequest:
        """Serve one request alone (the engine's prefill, then decode cycles).

        With ``prompt`` the result carries the twin's greedy output ids for it; ``category``
        (the prompt's) scales its acceptance as the twin server does (``drafter.category_mult``).
        """
        draw = self.noise.draw_request()
        draw = draw._replace(mult=draw.mult * self.profile.drafter.mult_for(category))
        rng = random.Random(self.seed * 1_000_003 + self._index)
        self._index += 1
        start = self.noise.start_factor
        chunk = self.chunked_prefill_size if self.chunked_prefill_size > 0 else None
        ttft = self.model.chunked_prefill_ms(prompt_tokens, chunk) * start
        elapsed = ttft
        out = 1 if max_new_tokens > 0 else 0
        cycles = 0
        spec = self.spec
        hist = [0] * (spec.num_draft_tokens if spec is not None else 1)
        if self.adaptive is not None:
            hist = [0] * (max(self.adaptive.candidate_steps) + 1)
        per_cycle = draw.time_factor * start
        itl: list[float] = []
        while out < max_new_tokens:
            ctx = prompt_tokens + out
            model, at0, slope = self._cost()
            cycle_ms = (at0 + slope * ctx) * per_cycle
            elapsed += cycle_ms
            drawn = model.sample_cycle_tokens(rng, draw.mult)
            given = min(drawn, max_new_tokens - out)
            out += given
            itl.extend([cycle_ms / given] * given)
            if spec is not None:
                cycles += 1
                hist[min(max(0, given - 1), len(hist) - 1)] += 1
            if self.adaptive is not None:
                self.adaptive.on_verify([max(0, given - 1)], 1)
        ids: tuple[int, ...] | None = None
        if prompt is not None:
            text = completion_ids(self.text_seed, prompt, out)
            ids = tuple(corrupt_ids(text, prompt) if self.corrupt else text)
        return SimulatedRequest(
            prompt_tokens=prompt_tokens,
            completion_tokens=out,
            output_ids=ids,
            verify_ct=cycles if spec is not None else None,
            ttft_ms=ttft,
            e2e_ms=elapsed,
            correct_drafts_histogram=tuple(hist) if spec is not None else None,
            itl_ms=tuple(itl),
        )

    def serve(self, asks: Sequence[LoadAsk], concurrency: int) -> list[LoadedRequest]:
        """Serve a load (``concurrency`` streams) with the HTTP twin's scheduler, on a virtual
        clock (:func:`rayspec.twin._load.serve_load`): the same batches, the same noise draws
        and cycle seeds per request index, continuing this start's numbering.

        Raises:
            rayspec.twin._load.SimulatedCrash: the scheduler died under this load.
        """
        clock = VirtualClock()
        quiet = SglangLog(self.version, self.tp_size, "error", stream=io.StringIO())
        engine = Engine(
            self.model, self.noise, quiet,
            max_running_requests=self.max_running, version=self.version, seed=self.seed,
            clock=clock, sleep=clock.sleep, adaptive=self.adaptive, first_index=self._index,
            cuda_graph_max_bs=self.graph_max_bs, graph_enabled=self.graph_enabled,
            chunked_prefill_size=self.chunked_prefill_size,
            max_prefill_tokens=self.max_prefill_tokens,
        )  # fmt: skip
        served = serve_load(engine, clock, asks, concurrency)
        self._index += len(asks)
        return served

    def output_ids(self, prompt: str, tokens: int) -> tuple[int, ...]:
        """The twin's greedy output ids for ``prompt`` (garbled where LL128 corrupts)."""
        text = completion_ids(self.text_seed, prompt, tokens)
        return tuple(corrupt_ids(text, prompt) if self.corrupt else text)
