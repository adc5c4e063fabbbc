"""EAGLE-3's draft tree: which draft nodes SGLang keeps, and what a cycle of them accepts (pure).

The arithmetic the twin's model (``rayspec.twin``) and the search's online model
(``rayspec.search``) share, so neither imports the other (docs/twin-model.md, *EAGLE-3*): a beam
of width m over k depths generates ``m + (k - 1) m²`` candidate nodes; the verify keeps the
``N - 1`` most probable (SGLang's ``torch.topk`` over the tree's scores, which fails when
``N - 1`` exceeds the candidates). At depth j the rank-1 child is accepted with the conditional
acceptance ``a_j`` and rank r >= 2 with ``(1 - a_j) theta (1 - theta)^(r - 2)`` (the runner-up
shape theta). A node's probability is the product along its path, so a child is never likelier
than its parent and the kept set is a valid tree.

This is a model of acceptance, and for the search an assumption that can be wrong on a real
node (a drafter whose runner-up ranks are not of this shape): the search fits theta to what it
measures, and the measurement decides.

Example::

    tree = build_draft_tree([0.635, 0.401], topk=4, num_draft_tokens=6, theta=0.34)
    tree.expected_tokens        # 1 + the 5 kept nodes' probabilities
"""

from __future__ import annotations

import dataclasses
import heapq
import random

from rayspec._exceptions import FailureReason
from rayspec._exceptions import RayspecError
from rayspec._types import SpecSettings

__all__ = ["DraftTree", "DraftTreeError", "build_draft_tree", "tree_fits", "tree_refusal"]


class DraftTreeError(RayspecError, RuntimeError):
    """A draft tree SGLang cannot run (:func:`tree_refusal`: more nodes asked for than the tree
    has, or a budget shorter than its accepted path)."""

    reason = FailureReason.INVALID_DRAFT_TREE


def tree_refusal(spec: SpecSettings) -> str | None:
    """The error SGLang fails with at the first decode of a tree it cannot run, None when it
    can (docs/sglang.md, *Speculative rules*)."""
    if spec.num_draft_tokens - 1 > spec.tree_capacity:
        return (
            "RuntimeError: selected index k out of range "
            f"(num_draft_tokens - 1 = {spec.num_draft_tokens - 1} > "
            f"{spec.tree_capacity} draft candidates)"
        )
    if not spec.holds_path:
        return (
            f"RuntimeError: The expanded size of the tensor ({spec.num_draft_tokens}) must "
            f"match the existing size ({spec.num_steps + 1}) at non-singleton dimension 1"
        )
    return None


def tree_fits(spec: SpecSettings) -> bool:
    """Whether SGLang can run the draft tree: keep ``num_draft_tokens - 1`` of its nodes, and
    hold its accepted path (*EAGLE-3*).

    A configuration that does not fit starts, then fails at the first decode (docs/sglang.md,
    *Speculative rules*).
    """
    return spec.fits_tree


@dataclasses.dataclass(frozen=True)
class DraftTree:
    """The draft nodes SGLang keeps for one set of per-depth acceptances (*EAGLE-3*).

    Attributes:
        depth_probs: per depth j = 1..k, the conditional acceptance ``q(j, r)`` of the rank-r
            child, r = 1..m.
        nodes: the kept nodes as rank paths, e.g. ``(1, 2)`` = second-ranked child of the
            top-ranked depth-1 node; closed under ancestors.
        probs: the kept nodes' unconditional acceptance probabilities, highest first.
    """

    depth_probs: tuple[tuple[float, ...], ...]
    nodes: frozenset[tuple[int, ...]]
    probs: tuple[float, ...]

    @property
    def expected_tokens(self) -> float:
        """Expected tokens per cycle: 1 (bonus) + sum of kept node probabilities."""
        return 1.0 + sum(self.probs)

    def sample(self, rng: random.Random) -> int:
        """Tokens one cycle emits: walk down, drawing the correct child's rank at each depth."""
        path: tuple[int, ...] = ()
        for q in self.depth_probs:
            u = rng.random()
            rank = 0
            for r, p in enumerate(q, start=1):
                if u < p:
                    rank = r
                    break
                u -= p
            if rank == 0:
                break
            child = (*path, rank)
            if child not in self.nodes:
                break
            path = child
        return len(path) + 1


def build_draft_tree(
    acceptance: list[float], topk: int, num_draft_tokens: int, theta: float
) -> DraftTree:
    """Build the kept draft tree (*EAGLE-3*) from per-depth conditional acceptance ``a_j``.

    Args:
        acceptance: ``a_j`` for j = 1..k (already scaled and capped).
        topk: m, the beam width.
        num_draft_tokens: N, the verify budget (N - 1 draft nodes are kept).
        theta: the runner-up shape θ: rank r ≥ 2 gets ``(1 - a_j) θ (1 - θ)^(r - 2)``.

    Raises:
        DraftTreeError: ``N - 1`` is larger than the ``m + (k - 1) m²`` candidates.
    """
    k = len(acceptance)
    depth_probs = tuple(
        tuple(
            a if r == 1 else (1 - a) * theta * (1 - theta) ** (r - 2) for r in range(1, topk + 1)
        )
        for a in acceptance
    )
    candidates: list[tuple[float, tuple[int, ...]]] = []
    frontier: list[tuple[float, tuple[int, ...]]] = [(1.0, ())]
    for j in range(k):
        children = [
            (p * depth_probs[j][r - 1], (*path, r))
            for p, path in frontier
            for r in range(1, topk + 1)
        ]
        candidates.extend(children)
        frontier = heapq.nsmallest(topk, children, key=_rank_key)
    budget = num_draft_tokens - 1
    if budget > len(candidates):
        raise DraftTreeError(
            "RuntimeError: selected index k out of range "
            f"(num_draft_tokens - 1 = {budget} > {len(candidates)} draft candidates)"
        )
    kept = heapq.nsmallest(budget, candidates, key=_rank_key)
    return DraftTree(
        depth_probs=depth_probs,
        nodes=frozenset(path for _, path in kept),
        probs=tuple(p for p, _ in kept),
    )


def _rank_key(item: tuple[float, tuple[int, ...]]) -> tuple[float, int, tuple[int, ...]]:
    # Highest probability first; on ties the shallower node first, so ancestors win and the
    # kept set stays closed under ancestors.
    p, path = item
    return (-p, len(path), path)
