"""The twin's performance model: forward, verify, draft and cycle cost, and acceptance.

Pure functions of a :class:`~rayspec.twin.Profile`, a resolved :class:`NcclSetup` and the
speculative settings (docs/twin-model.md: *Forward pass*, *EAGLE-3*, *Batching*). The model gives
expected values; :meth:`PerfModel.sample_cycle_tokens` draws one cycle's emitted tokens the way
its per-cycle sampling specifies, so the twin can report integer counts whose mean is the expected
accept length.

Example::

    model = PerfModel(profile, resolve_nccl(env, profile), SpecSettings("EAGLE3", 2, 1, 3))
    model.step_ms(batch=1)              # 19.905 ms: one verify + draft cycle (tuned NCCL)
    model.expected_accept_length()      # 1.88984
    model.expected_tok_s()              # 94.94
"""

from __future__ import annotations

import collections
import dataclasses
import math
import random
import threading

from rayspec._drafttree import DraftTree
from rayspec._drafttree import DraftTreeError
from rayspec._drafttree import build_draft_tree
from rayspec._drafttree import tree_fits
from rayspec._drafttree import tree_refusal
from rayspec._types import SpecSettings
from rayspec.twin._nccl import NcclSetup
from rayspec.twin._profile import Profile

__all__ = ["DraftTree", "PerfModel", "build_draft_tree", "tree_fits"]

_TREE_CACHE_SIZE = 256  # draft trees kept per model (not a model constant: a memory bound)


class PerfModel:
    """Expected cost and acceptance of one server configuration (docs/twin-model.md, *The model in
    one page*).

    Immutable after construction apart from a small, lock-protected cache of draft trees, so
    one instance may be shared between threads.

    Args:
        profile: the hardware/model profile.
        nccl: the resolved NCCL setup of the server start.
        spec: the EAGLE-3 settings after SGLang's normalisation (topk 1 ⇒ N = k + 1), or None
            for no speculation.

    Raises:
        ValueError: ``spec`` is not normalised (topk 1 with N ≠ k + 1, or values below 1).
    """

    def __init__(
        self,
        profile: Profile,
        nccl: NcclSetup,
        spec: SpecSettings | None,
        *,
        adaptive: bool = False,
    ) -> None:
        if spec is not None:
            if spec.num_steps < 1 or spec.eagle_topk < 1 or spec.num_draft_tokens < 1:
                raise ValueError(f"speculative settings must be >= 1, got {spec}")
            if spec.eagle_topk == 1 and spec.num_draft_tokens != spec.num_steps + 1:
                raise ValueError(
                    "speculative settings are not normalised: topk 1 forces num_draft_tokens "
                    f"= num_steps + 1 = {spec.num_steps + 1}, got {spec.num_draft_tokens}"
                )
        self.profile = profile
        self.nccl = nccl
        self.spec = spec
        # Under --speculative-adaptive every iteration pays the controller (adaptive_ms), the
        # tiers' plain decoding too (``with_steps(0)``).
        self.adaptive = adaptive or (spec is not None and spec.adaptive)
        # Small LRU: one request keeps one ``mult`` for all its cycles.
        self._trees: collections.OrderedDict[float, DraftTree] = collections.OrderedDict()
        self._trees_lock = threading.Lock()

    def with_steps(self, steps: int) -> PerfModel:
        """The same start drafting a ``steps`` chain (0: plain decoding): adaptive steps."""
        spec = self._require_spec()
        if steps == 0:
            return PerfModel(self.profile, self.nccl, None, adaptive=self.adaptive)
        chain = dataclasses.replace(
            spec, num_steps=steps, eagle_topk=1, num_draft_tokens=steps + 1, adaptive=False
        )
        return PerfModel(self.profile, self.nccl, chain, adaptive=self.adaptive)

    # ---------------------------------------------------------------- forward pass

    def expected_experts(self, tokens: int) -> float:
        """E(T): expected distinct routed experts per MoE layer for T tokens (0 if dense)."""
        moe = self.profile.model.moe
        if moe is None:
            return 0.0
        n, k = moe.n_experts, moe.experts_per_token
        return n * (1.0 - (1.0 - k / n) ** tokens)

    def kv_ms(self, batch: int, ctx: float | None) -> float:
        """KV reads beyond the calibration context (signed; 0 when ``ctx`` is None)."""
        if ctx is None:
            return 0.0
        m = self.profile.model
        return (
            batch
            * (ctx - m.calib_context)
            * m.layers
            * m.kv_bytes_per_token_layer
            / m.kv_bw_bytes_per_ms
        )

    def forward_ms(self, tokens: int, batch: int, ctx: float | None = None) -> float:
        """T_fwd: one target forward of ``tokens`` tokens for ``batch`` running requests.

        Raises:
            NcclNoAlgorithmError: the NCCL setup has no usable AllReduce algorithm.
        """
        if tokens < 1 or batch < 1:
            raise ValueError(f"tokens and batch must be >= 1, got {tokens}, {batch}")
        f = self.profile.forward
        m = self.profile.model
        moe = m.moe
        expert_term = f.W0_ms
        if moe is not None:
            expert_term += f.c_e_ms * (self.expected_experts(tokens) - moe.experts_per_token)
        coll_ms = m.collectives_per_forward * self.nccl.allreduce_us(tokens * m.token_bytes) / 1000
        return (
            (f.C0_ms - f.W0_ms)
            + max(expert_term, f.flop_tok_ms * tokens)
            + f.p_tok_ms * (tokens - 1)
            + self.kv_ms(batch, ctx)
            + coll_ms
        )

    # ------------------------------------------------------------- speculative

    def verify_ms(self, batch: int = 1, ctx: float | None = None, *, graph: bool = True) -> float:
        """V: one TARGET_VERIFY forward over ``batch · N`` tokens plus F_spec (in a graph at
        the next of ``forward.graph_token_sizes``; a tree pays ``tree_verify_ms_per_token``
        per verified token more: *Model variants*)."""
        spec = self._require_spec()
        tokens = batch * spec.num_draft_tokens
        run_at = self.profile.forward.graph_tokens(tokens) if graph else tokens
        s = self.profile.speculative
        tree = s.tree_verify_ms_per_token * tokens if spec.eagle_topk > 1 else 0.0
        return (
            self.forward_ms(run_at, batch, ctx)
            + s.f_spec_ms(spec.overlap or spec.eagle_topk > 1)
            + tree
        )

    def draft_ms(self, batch: int = 1) -> float:
        """D: the k draft steps of one cycle (drafter forwards and their collectives; a topk-m
        step pays ``topk_step_ms (m**topk_power - 1)`` more: *Model variants*)."""
        spec = self._require_spec()
        s = self.profile.speculative
        payload = batch * spec.eagle_topk * self.profile.model.token_bytes
        per_step = (
            s.d_step_ms
            + s.draft_collectives_per_step * self.nccl.allreduce_us(payload) / 1000
            + s.topk_step_ms * (math.pow(spec.eagle_topk, s.topk_power) - 1.0)
        )
        return s.D0_ms + spec.num_steps * per_step

    def eager_ms(self) -> float:
        """What one decode iteration costs more outside a CUDA graph: the launch overhead of
        the target forward and, with speculation, of each draft step (*Batching*)."""
        extra = self.profile.forward.eager_ms
        if self.spec is not None:
            extra += self.spec.num_steps * self.profile.speculative.draft_eager_ms
        return extra

    def step_ms(
        self, batch: int = 1, ctx: float | None = None, mult: float = 1.0, *, graph: bool = True
    ) -> float:
        """One decode iteration (no speculation) or one EAGLE-3 cycle V + D, in ms.

        Args:
            batch: running decode requests B.
            ctx: mean context length of the running requests (None: the calibration context).
            mult: the request's acceptance multiplier. The cycle's cost does not depend on it in
                the reference formulas; it is accepted so callers can pass one request's draw.
            graph: the batch runs as a captured CUDA graph; False adds :meth:`eager_ms`.

        Raises:
            NcclNoAlgorithmError: the NCCL setup has no usable AllReduce algorithm.
            DraftTreeError: the draft-token budget does not fit the tree.
        """
        del mult  # cost is independent of acceptance
        # Adaptive mode's controller (adaptive_ms) and eager launches are paid every iteration.
        extra = (self.profile.speculative.adaptive_ms if self.adaptive else 0.0) + (
            0.0 if graph else self.eager_ms()
        )
        if self.spec is None:
            tokens = self.profile.forward.graph_tokens(batch) if graph else batch
            return self.forward_ms(tokens, batch, ctx) + extra
        self._check_tree()
        return self.verify_ms(batch, ctx, graph=graph) + self.draft_ms(batch) + extra

    # --------------------------------------------------------------- acceptance

    def acceptance(self, mult: float = 1.0) -> list[float]:
        """a_j for j = 1..k: ``min(a_cap, mult · base_j)`` (empty without speculation)."""
        if self.spec is None:
            return []
        d = self.profile.drafter
        return [
            min(d.a_cap, max(0.0, mult * d.acceptance.base(j)))
            for j in range(1, self.spec.num_steps + 1)
        ]

    def draft_tree(self, mult: float = 1.0) -> DraftTree:
        """The kept draft tree for an acceptance multiplier (cached per ``mult``)."""
        spec = self._require_spec()
        with self._trees_lock:
            tree = self._trees.get(mult)
            if tree is not None:
                self._trees.move_to_end(mult)
                return tree
        tree = build_draft_tree(
            self.acceptance(mult),
            spec.eagle_topk,
            spec.num_draft_tokens,
            self.profile.drafter.tree_theta,
        )
        with self._trees_lock:
            self._trees[mult] = tree
            while len(self._trees) > _TREE_CACHE_SIZE:
                self._trees.popitem(last=False)
        return tree

    def expected_accept_length(self, mult: float = 1.0) -> float:
        """L: expected tokens emitted per cycle (1 without speculation).

        Chain (topk 1): ``1 + Σ_i Π_{j≤i} a_j``; tree: 1 + the N − 1 largest node probabilities.
        """
        if self.spec is None:
            return 1.0
        if self.spec.eagle_topk == 1:
            total, prefix = 1.0, 1.0
            for a in self.acceptance(mult):
                prefix *= a
                total += prefix
            return total
        return self.draft_tree(mult).expected_tokens

    def sample_cycle_tokens(self, rng: random.Random, mult: float = 1.0) -> int:
        """Draw the tokens one cycle emits (accepted drafts + the bonus token): per-cycle sampling.

        Returns 1 without speculation. The mean over many draws equals
        :meth:`expected_accept_length` for the same ``mult``.
        """
        if self.spec is None:
            return 1
        if self.spec.eagle_topk == 1:
            tokens = 1
            for a in self.acceptance(mult):
                if rng.random() >= a:
                    break
                tokens += 1
            return tokens
        return self.draft_tree(mult).sample(rng)

    # ------------------------------------------------------------------- throughput

    def expected_tok_s(self, batch: int = 1, ctx: float | None = None) -> float:
        """Expected decode speed of one request, tokens/s (aggregate = ``batch`` × this)."""
        return 1000.0 * self.expected_accept_length() / self.step_ms(batch, ctx)

    def prefill_ms(self, prompt_tokens: int) -> float:
        """Time to first token for one prompt. UNCALIBRATED placeholder (docs/twin-model.md, *Open
        points*)."""
        u = self.profile.uncalibrated
        return u.prefill_base_ms + u.prefill_ms_per_token * max(0, prompt_tokens)

    def chunked_prefill_ms(self, prompt_tokens: int, chunk: int | None) -> float:
        """A prompt prefilled alone in forwards of at most ``chunk`` tokens (None: one)."""
        if chunk is None or chunk < 1 or prompt_tokens <= chunk:
            return self.prefill_ms(prompt_tokens)
        full, rest = divmod(prompt_tokens, chunk)
        return full * self.prefill_ms(chunk) + (self.prefill_ms(rest) if rest else 0.0)

    # ------------------------------------------------------------------------------ helpers

    def _require_spec(self) -> SpecSettings:
        if self.spec is None:
            raise ValueError("this model has no speculative settings")
        return self.spec

    def _check_tree(self) -> None:
        spec = self._require_spec()
        refusal = tree_refusal(spec)
        if refusal is not None:
            raise DraftTreeError(refusal)
