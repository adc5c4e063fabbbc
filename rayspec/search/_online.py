"""The node's own speculative model, fitted online from what each start already reports (pure).

Every speculative request returns how many drafts each verify step accepted (SGLang's
``spec_correct_drafts_histogram``, stored as ``accept_histogram``), and every measured start
gives its decode rate. The search then assumes a form for the node's speculative decoding and
fits a few numbers of the node's own to it. **The form is the search's assumption, and it can
be wrong**: it is the form the twin is built on (docs/twin-model.md, *EAGLE-3*), but this module
shares no code with the twin (the draft-tree arithmetic both use is ``rayspec._drafttree``), and
a real node may break any part of it: verify costs that step at the token counts kernels and
CUDA graphs are built for, a drafter whose acceptance is not geometric in depth, a draft cost
that grows with topk, a tree's verify paying another attention path than a chain's
(``benchmarks/search_efficiency.py``'s outside-form cases, each breaking one of these, grade
the search where it is wrong). The form:

- **Acceptance** (:func:`fit_acceptance`): a chain of k steps drafts depth by depth and stops at
  the first rejection, so a verify step that accepted ``i`` drafts passed depths 1..i and failed
  depth i + 1 (none failed when i = k). The likelihood of a histogram ``h`` is
  ``prod_d a_d^{S_d} (1 - a_d)^{S_{d-1} - S_d}`` with ``S_d = sum_{i>=d} h_i``, so the per-depth
  conditional acceptance has the closed form ``a_d = S_d / S_{d-1}`` (pooled over chains that
  reach depth d). Beyond the deepest measured depth K a geometric decay extrapolates:
  ``a_d = a_K rho^(d-K)``, ``rho`` the count-weighted log-linear slope of the measured rates
  (at most 1). A chain's accept length is ``L(k) = 1 + sum_i prod_{j<=i} a_j``; a tree's is the
  tree of :func:`rayspec._drafttree.build_draft_tree` (the N - 1 likeliest nodes of a beam,
  runner-up ranks shaped by ``theta``) with ``theta`` fitted to the measured trees' accept
  lengths. Assumed: acceptance is a property of the depth alone (not of topk or the budget),
  geometric past the measured depths, and a tree's runner-ups follow ``theta``'s shape.
- **Cost** (:func:`fit_costs`): a cycle of k steps verifying N tokens costs
  ``c(k, N) = c0 + gamma (N - 1) + beta k`` ms (linear in the verify width and the draft steps;
  assumed: no term in topk, none in the accepted tokens, one form for chains and trees). A
  start's cycle time is measured without any model of acceptance: ``1000 L / tok_s`` with L
  from its own histogram. Chains alone fix ``c0`` and
  ``gamma + beta`` (two depths needed); one tree (N - 1 > k) splits ``gamma`` from ``beta``.
  Before a tree splits them, a tree is predicted with the slope split evenly between its width
  and its depth (``c0 + (gamma + beta) (N - 1 + k) / 2``): the field's verify width is most of
  the slope, the dense NVLink node's draft steps are, and the even split's best tree is within
  3 % of the optimum on both (the costliest split proposed a chain on the NVLink node, 8 %
  short); with chains at two depths its measurement splits the slope. With chains at one depth
  only, the slope is taken as ``_SLOPE_PRIOR`` of the measured cycle per step (the costliest of
  the twin's nodes, the field's 4.4 %), and trees are predicted on its even split too: the
  first chain already proposes the tree it puts best (on 20 seeds this took the field's pick
  to within 1 % a restart earlier, 4.5 instead of 6). A tree beside chains at one depth fits
  the even split's slope (one chain and one tree fit either slope alone exactly, so they are
  not parted until a second chain depth).
- **Prediction** (:meth:`OnlineModel.predict`): ``tok/s = 1000 L(spec) / c(spec)``.

The model only proposes (``StructuredSearch``'s model stage): the measurement decides.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rayspec._drafttree import build_draft_tree
from rayspec._types import SpecSettings

__all__ = [
    "Acceptance",
    "Costs",
    "Measured",
    "OnlineModel",
    "fit_acceptance",
    "fit_costs",
    "fit_model",
    "mean_accept_length",
]

# A rate is estimated from at least this many verify steps reaching its depth; shallower data
# is noise (a rate from 3 steps can be 0 or 1).
_MIN_STEPS = 20
_THETA_PRIOR = 0.34  # the runner-up shape before any tree is measured (the field drafter's)
# A cycle's cost per draft step (with its verify token) relative to the cycle, before two
# depths are measured: the costliest of the twin's nodes (field 4.4 %, dense NVLink 2.5 %,
# L40S 0.8 %), so a deeper chain proposed on it is one that pays on any of them.
_SLOPE_PRIOR = 0.045


@dataclass(frozen=True)
class Acceptance:
    """Per-depth conditional acceptance fitted from chain histograms.

    Attributes:
        rates: ``a_d`` for the measured depths d = 1..K.
        reached: verify steps that reached each depth (``S_{d-1}``): the weight of each rate.
        decay: ``rho``, the per-depth decay past K (at most 1).
    """

    rates: tuple[float, ...]
    reached: tuple[int, ...]
    decay: float

    def rate(self, depth: int) -> float:
        """``a_d`` at any depth d >= 1 (extrapolated past the measured ones)."""
        k = len(self.rates)
        if depth <= k:
            return self.rates[depth - 1]
        return self.rates[-1] * self.decay ** (depth - k)

    def chain_length(self, steps: int) -> float:
        """Expected tokens per cycle of a ``steps`` chain: ``1 + sum_i prod_{j<=i} a_j``."""
        total, prefix = 1.0, 1.0
        for d in range(1, steps + 1):
            prefix *= self.rate(d)
            total += prefix
        return total

    def tree_length(self, spec: SpecSettings, theta: float) -> float:
        """Expected tokens per cycle of ``spec`` (a chain, or the twin's tree for ``theta``)."""
        if spec.eagle_topk == 1:
            return self.chain_length(spec.num_steps)
        rates = [self.rate(d) for d in range(1, spec.num_steps + 1)]
        tree = build_draft_tree(rates, spec.eagle_topk, spec.num_draft_tokens, theta)
        return tree.expected_tokens


def fit_acceptance(chains: Sequence[tuple[int, Sequence[int]]]) -> Acceptance | None:
    """The maximum-likelihood per-depth acceptance of chain histograms.

    Args:
        chains: (steps k, histogram) per measured chain start; ``histogram[i]`` counts the
            verify steps that accepted i drafts (it may be shorter than k + 1: SGLang trims it
            after the most accepted).

    Returns:
        None when no depth was reached by ``_MIN_STEPS`` verify steps.
    """
    depth = max((k for k, _ in chains), default=0)
    passed = [0] * (depth + 1)  # passed[d] = sum over chains reaching d of S_d
    reached = [0] * (depth + 1)  # reached[d] = sum over chains reaching d of S_{d-1}
    for k, hist in chains:
        tail = [sum(hist[i:]) for i in range(len(hist) + 1)]  # tail[d] = S_d
        for d in range(1, k + 1):
            reached[d] += tail[d - 1] if d - 1 < len(tail) else 0
            passed[d] += tail[d] if d < len(tail) else 0
    rates: list[float] = []
    counts: list[int] = []
    for d in range(1, depth + 1):
        if reached[d] < _MIN_STEPS:
            break
        rates.append(passed[d] / reached[d])
        counts.append(reached[d])
    if not rates:
        return None
    return Acceptance(tuple(rates), tuple(counts), _decay(rates, counts))


def _decay(rates: Sequence[float], counts: Sequence[int]) -> float:
    """The count-weighted log-linear slope of the rates (the twin's ``rho``), at most 1."""
    pts = [(d, math.log(a), n) for d, (a, n) in enumerate(zip(rates, counts, strict=True), 1)
           if a > 0]  # fmt: skip
    if len(pts) < 2:
        return 1.0 if rates and rates[-1] > 0 else 0.0
    w = sum(n for _, _, n in pts)
    md = sum(d * n for d, _, n in pts) / w
    my = sum(y * n for _, y, n in pts) / w
    sxx = sum(n * (d - md) ** 2 for d, _, n in pts)
    sxy = sum(n * (d - md) * (y - my) for d, y, n in pts)
    return min(1.0, math.exp(sxy / sxx))


@dataclass(frozen=True)
class Measured:
    """One speculative configuration as measured: its settings, decode rate and histogram."""

    spec: SpecSettings
    tok_s: float
    histogram: tuple[int, ...]

    @property
    def accept_length(self) -> float:
        return mean_accept_length(self.histogram)

    @property
    def cycle_ms(self) -> float:
        """The measured cycle time: tokens per cycle over tokens per ms."""
        return 1000.0 * self.accept_length / self.tok_s


def mean_accept_length(histogram: Sequence[int]) -> float:
    """Tokens per verify step of a histogram: 1 + the mean drafts accepted (NaN if empty)."""
    steps = sum(histogram)
    if steps <= 0:
        return math.nan
    return 1.0 + sum(i * n for i, n in enumerate(histogram)) / steps


@dataclass(frozen=True)
class Costs:
    """``c(k, N) = c0 + gamma (N - 1) + beta k`` ms per cycle.

    ``split`` is False when the two slopes are not told apart (chains only, or chains at one
    depth beside trees): ``beta`` holds their sum (``gamma`` 0) and a setting is costed with
    it split evenly between its width and its depth (exact for chains). ``prior`` is True when
    only chains at one depth were measured, so ``beta`` is ``_SLOPE_PRIOR``'s.
    """

    c0: float
    gamma: float
    beta: float
    split: bool
    prior: bool = False

    def cycle_ms(self, spec: SpecSettings) -> float:
        width = spec.num_draft_tokens - 1
        if not self.split:
            return self.c0 + self.beta * (width + spec.num_steps) / 2
        return self.c0 + self.gamma * width + self.beta * spec.num_steps


def fit_costs(measured: Sequence[Measured]) -> Costs | None:
    """Least squares of the measured cycle times on the cost form (None: not identified).

    Needs a chain. With chains at one depth the slope is the prior's (``Costs.prior``), or,
    with trees beside them, fitted on the even split; chains at two depths and a tree with more
    draft tokens than steps split the verify width from the draft steps.
    """
    rows = [(m.spec, m.cycle_ms) for m in measured if math.isfinite(m.cycle_ms)]
    chains = [(s.num_steps, c) for s, c in rows if s.eagle_topk == 1]
    if not chains:
        return None  # the level and the slope both rest on a chain
    y = np.array([c for _, c in rows])
    width = np.array([s.num_draft_tokens - 1.0 for s, _ in rows])
    steps = np.array([float(s.num_steps) for s, _ in rows])
    if len({k for k, _ in chains}) == 1:
        # Chains at one depth, and trees: too few designs to part the two slopes (one chain
        # and one tree fit either slope alone exactly), so the even split's slope is fitted to
        # them all. Chains alone: the slope is the prior's, the level the chain's.
        x = np.column_stack([np.ones(len(rows)), (width + steps) / 2])
        if np.linalg.matrix_rank(x) == 2:
            c0, slope = (float(c) for c in np.linalg.lstsq(x, y, rcond=None)[0])
            if slope >= 0:
                return Costs(c0, 0.0, slope, split=False)
        k = chains[0][0]
        cycle = math.exp(sum(math.log(c) for _, c in chains) / len(chains))
        slope = _SLOPE_PRIOR * cycle
        return Costs(cycle - slope * k, 0.0, slope, split=False, prior=True)
    split = bool(np.any(width != steps))  # a tree wider than its depth: the two slopes part
    # (gamma, beta) columns per design; without a tree only their sum (on the steps) is known.
    # A negative slope is noise on a nearly free axis (two chains 2 % apart): that axis is
    # fitted as costing nothing, and the measurement the model then proposes (deep) settles it.
    designs = [(True, True), (True, False), (False, True)] if split else [(False, True)]
    best: tuple[float, Costs] | None = None
    identified = False
    for on_width, on_steps in [*designs, (False, False)]:
        cols = [np.ones(len(rows))] + [width] * on_width + [steps] * on_steps
        x = np.column_stack(cols)
        if np.linalg.matrix_rank(x) < x.shape[1] or (not identified and x.shape[1] == 1):
            continue
        identified = True
        coef = [float(c) for c in np.linalg.lstsq(x, y, rcond=None)[0]]
        if min(coef[1:], default=0.0) < 0:
            continue
        gamma = coef[1] if on_width else 0.0
        beta = coef[-1] if on_steps else 0.0
        sse = float(np.sum((x @ np.array(coef) - y) ** 2))
        if best is None or sse < best[0]:
            best = (sse, Costs(coef[0], gamma, beta, split=split))
    return best[1] if best is not None else None


@dataclass(frozen=True)
class OnlineModel:
    """The fitted node: acceptance, costs and the trees' runner-up shape."""

    acceptance: Acceptance
    costs: Costs
    theta: float

    def predict(self, spec: SpecSettings) -> float | None:
        """Predicted decode rate (tok/s) of ``spec``; None where the fit cannot say (adaptive
        steps, a tree that does not fit, a non-positive cycle). Until the slopes are parted a
        tree's rests on an even split of the cost slope (:class:`Costs`), the prior's while
        only chains at one depth were measured."""
        if spec.adaptive or not spec.fits_tree:
            return None
        cycle = self.costs.cycle_ms(spec)
        if cycle <= 0:
            return None
        return 1000.0 * self.acceptance.tree_length(spec, self.theta) / cycle


def fit_model(measured: Sequence[Measured]) -> OnlineModel | None:
    """Acceptance from the chains, costs from every start, theta from the trees."""
    chains = [(m.spec.num_steps, m.histogram) for m in measured if m.spec.eagle_topk == 1]
    acceptance = fit_acceptance(chains)
    costs = fit_costs(measured)
    if acceptance is None or costs is None:
        return None
    trees = [m for m in measured if m.spec.eagle_topk > 1]
    return OnlineModel(acceptance, costs, _fit_theta(acceptance, trees))


def _fit_theta(acceptance: Acceptance, trees: Sequence[Measured]) -> float:
    """The runner-up shape whose tree accept lengths match the measured ones best."""
    rows = [(m.spec, m.accept_length) for m in trees
            if m.spec.fits_tree and math.isfinite(m.accept_length)]  # fmt: skip
    if not rows:
        return _THETA_PRIOR

    def loss(theta: float) -> float:
        return sum((acceptance.tree_length(s, theta) - length) ** 2 for s, length in rows)

    grid = [i / 50 for i in range(1, 50)]
    return min(grid, key=loss)
