"""What the measurements say about each configuration, with the noise that is really there.

A configuration (a *point*) is measured in one or more server *starts*; each start gives several
runs. Two noises add up (docs/twin-model.md, *Noise*, and real servers alike):

- within a start, run to run (acceptance draws, timing jitter): estimated from the runs;
- between starts of the same configuration (clocks, thermals, placement): invisible inside one
  start, so it is estimated from the configurations that were started more than once, pooled,
  by a random-effects model (:func:`between_posterior`) with a weak prior around
  ``study.start_noise`` (1 % by default; a factor of 3 either way is one sd) that the repeated
  starts soon outweigh: a node whose starts vary by 3 % is judged at 3 %.

Everything is on the log scale (noise is relative). A point's estimate weights each start's
mean by ``1 / (between² + within² / runs)``, so a start with many runs counts more but never
more than the between-start noise allows, and two starts beat one start with many runs. These
are pure functions of numbers; nothing here knows about trials or Optuna.

Example::

    noise = estimate_noise({"a": [Start(1, (94.0, 95.1)), Start(7, (96.2, 95.0))]})
    est = estimate([Start(1, (94.0, 95.1)), Start(7, (96.2, 95.0))], noise)
    prob_better(est, other)   # P(true mean of est > true mean of other)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "Estimate",
    "Noise",
    "Start",
    "between_posterior",
    "estimate",
    "estimate_noise",
    "expected_gain",
    "prob_better",
    "prob_positive",
    "within_var",
]

# A point's within-start variance is shrunk towards the pooled one with this weight (in
# degrees of freedom).
_WITHIN_PRIOR_DF = 2.0
# The between-start sd's prior: log-normal around study.start_noise, one sd a factor of 3 (3 %
# is 1 sd out); as information it is worth 1 / (2 ln(3)²) ~ 0.4 degree of freedom of repeated
# starts.
_PRIOR_LOG_SD = math.log(3.0)
_PRIOR_DF = 1.0 / (2.0 * _PRIOR_LOG_SD**2)
# The grid the posterior of the between-start sd is computed on (relative sd, log scale): up to
# 1.5, since a start on a loaded host can read a fifth of another (12 and 60 tok/s measured).
_GRID_LOW, _GRID_HIGH, _GRID_SIZE = 0.0005, 1.5, 200
_MIN_WITHIN = 1e-4  # a 0.01 % floor: a constant series still has finite precision


@dataclass(frozen=True)
class Start:
    """One server start of a point: the trial that ran it and its per-run objective values."""

    trial: int
    runs: tuple[float, ...]

    @property
    def logs(self) -> list[float]:
        return [math.log(v) for v in self.runs if v > 0 and math.isfinite(v)]


@dataclass(frozen=True)
class Noise:
    """Relative noise: per run within a start (pooled), and per start.

    Attributes:
        within: pooled relative sd of one run inside a start.
        between: relative sd of a start's level around the configuration's true mean.
        between_df: how many degrees of freedom back ``between`` (the prior's included).
        posterior: the between-start sd's posterior, (sigma, probability) on a grid, once a
            configuration was started twice (:func:`between_posterior`); empty before.
    """

    within: float
    between: float
    between_df: float
    posterior: tuple[tuple[float, float], ...] = ()


@dataclass(frozen=True)
class Estimate:
    """A point's posterior: ``mean`` in objective units, ``sd`` relative (log scale).

    Attributes:
        mean: the posterior mean (exp of the weighted log mean).
        sd: the posterior standard deviation of the log mean.
        starts: server starts pooled.
        runs: measured runs pooled.
        within: this point's relative sd of one run (shrunk towards the pooled one).
    """

    mean: float
    sd: float
    starts: int
    runs: int
    within: float

    @property
    def log_mean(self) -> float:
        return math.log(self.mean)


def within_var(starts: Sequence[Start]) -> tuple[float, float]:
    """Sum of squared log deviations from each start's mean, and its degrees of freedom."""
    ss, df = 0.0, 0.0
    for s in starts:
        logs = s.logs
        if len(logs) >= 2:
            m = sum(logs) / len(logs)
            ss += sum((x - m) ** 2 for x in logs)
            df += len(logs) - 1
    return ss, df


def _pooled_within(groups: Mapping[str, Sequence[Start]]) -> float:
    ss, df = 0.0, 0.0
    for starts in groups.values():
        s, d = within_var(starts)
        ss, df = ss + s, df + d
    return math.sqrt(ss / df) if df > 0 else 0.02


def _point_within(starts: Sequence[Start], pooled: float) -> float:
    ss, df = within_var(starts)
    var = (ss + _WITHIN_PRIOR_DF * pooled**2) / (df + _WITHIN_PRIOR_DF)
    return max(math.sqrt(var), _MIN_WITHIN)


def _log_grid() -> tuple[float, ...]:
    lo, hi = math.log(_GRID_LOW), math.log(_GRID_HIGH)
    return tuple(math.exp(lo + (hi - lo) * i / (_GRID_SIZE - 1)) for i in range(_GRID_SIZE))


_GRID = _log_grid()


def _restricted_loglik(sigma: float, repeated: Sequence[Sequence[tuple[float, float]]]) -> float:
    """log p(start means | sigma), each configuration's own level integrated out (REML).

    ``repeated``: per configuration started twice or more, each start's (log mean, variance
    of that mean from its own runs).
    """
    total = 0.0
    var_b = sigma * sigma
    for means in repeated:
        weights = [1.0 / (var_b + v) for _, v in means]
        wsum = sum(weights)
        level = sum(w * m for w, (m, _) in zip(weights, means, strict=True)) / wsum
        total -= 0.5 * (
            sum(math.log(1.0 / w) for w in weights)
            + math.log(wsum)
            + sum(w * (m - level) ** 2 for w, (m, _) in zip(weights, means, strict=True))
        )
    return total


def between_posterior(
    groups: Mapping[str, Sequence[Start]], *, prior_between: float = 0.01
) -> list[tuple[float, float]]:
    """The posterior of the between-start relative sd, on a log grid: (sigma, probability).

    A random-effects model on the log scale: start ``j`` of configuration ``c`` has mean
    ``mu_c + b_j + e_j``, with ``b_j ~ N(0, sigma²)`` (the start's offset) and ``e_j ~ N(0,
    within_c² / runs_j)`` (its own run noise). Every configuration started twice or more
    informs ``sigma``, pooled; its level ``mu_c`` is integrated out (flat). The prior on
    ``sigma`` is log-normal with median ``prior_between`` and a factor of 3 for one sd: weak,
    so 3 % is as plausible a priori as 0.33 % and the starts decide.
    """
    pooled = _pooled_within(groups)
    repeated: list[list[tuple[float, float]]] = []
    for starts in groups.values():
        used = [s for s in starts if s.logs]
        if len(used) < 2:
            continue
        within = _point_within(used, pooled)
        repeated.append([(sum(s.logs) / len(s.logs), within**2 / len(s.logs)) for s in used])
    centre = math.log(prior_between)
    logpost = [
        _restricted_loglik(sig, repeated) - 0.5 * ((math.log(sig) - centre) / _PRIOR_LOG_SD) ** 2
        for sig in _GRID
    ]
    top = max(logpost)
    weights = [math.exp(lp - top) for lp in logpost]
    total = sum(weights)
    return [(sig, w / total) for sig, w in zip(_GRID, weights, strict=True)]


def estimate_noise(groups: Mapping[str, Sequence[Start]], *, prior_between: float = 0.01) -> Noise:
    """Pool the within-start and between-start noise over every measured point.

    The between-start sd is the median of :func:`between_posterior`; while no configuration
    was started twice it is ``prior_between`` (and the pick's floor guard judges one start at
    3x its sd). The predictive ``sqrt(E[sigma²])`` was tried in its place: above the median
    with few repeats, it cost the field profile a restart to 1 % and three to stop.
    ``between_df`` counts
    the repeated starts' degrees of freedom plus the prior's worth (0.4 of one).

    Args:
        groups: each point's starts.
        prior_between: the prior median of the between-start relative sd (``study.start_noise``).
    """
    pooled = _pooled_within(groups)
    df = sum(
        len([s for s in starts if s.logs]) - 1
        for starts in groups.values()
        if len([s for s in starts if s.logs]) >= 2
    )
    if df == 0:  # nothing started twice: the prior's median
        return Noise(pooled, prior_between, _PRIOR_DF)
    posterior = between_posterior(groups, prior_between=prior_between)
    cumulative, between = 0.0, posterior[-1][0]
    for i, (sig, prob) in enumerate(posterior):
        if cumulative + prob >= 0.5:  # the median, interpolated on the log grid
            lo = posterior[i - 1][0] if i > 0 else sig
            frac = (0.5 - cumulative) / prob
            between = math.exp(math.log(lo) + frac * (math.log(sig) - math.log(lo)))
            break
        cumulative += prob
    return Noise(pooled, between, df + _PRIOR_DF, tuple(posterior))


def prob_positive(
    diff: float, sd: float, noise: Noise | None = None, offsets: float = 0.0
) -> float:
    """P(a log difference measured as ``diff`` ± ``sd`` is truly positive), the between-start
    sd uncertain: ``sd`` was computed at ``noise.between``, the posterior's median; over the
    sigma's posterior its variance is larger by ``(E[sigma²] - between²) x offsets``
    (``offsets``: how many start offsets the difference carries, 1/starts of each side).
    Without ``noise`` (or its posterior, or offsets) it is the plain normal at ``sd``.

    With one pair of repeated starts the median sigma is as often a third too low as a third
    too high, and a single start's offset is a draw from the wider one too: a normal at the
    median took a 3.3 sd lucky start (a rival truly 1 % below a floor, measured 7 % above it)
    for a 99.9 % lead. The normal with the predictive variance does not. (The full mixture
    over the posterior was tried: with one pair its tail out to 10 % start noise kept a 20 %
    lead below 99.9 %.)
    """
    if noise is None or not noise.posterior or offsets <= 0:
        return _normal_cdf(diff, sd)
    mean_var = sum(prob * sigma * sigma for sigma, prob in noise.posterior)
    var = sd * sd + max(mean_var - noise.between**2, 0.0) * offsets
    return _normal_cdf(diff, math.sqrt(var))


def _normal_cdf(diff: float, sd: float) -> float:
    if sd <= 0:
        return 1.0 if diff > 0 else 0.0
    return 0.5 * math.erfc(-diff / (sd * math.sqrt(2.0)))


def estimate(starts: Sequence[Start], noise: Noise) -> Estimate | None:
    """The posterior of one point from its starts (None when no start has a finite run)."""
    used = [s for s in starts if s.logs]
    if not used:
        return None
    within = _point_within(used, noise.within)
    weight_sum, weighted = 0.0, 0.0
    for s in used:
        logs = s.logs
        w = 1.0 / (noise.between**2 + within**2 / len(logs))
        weight_sum += w
        weighted += w * sum(logs) / len(logs)
    return Estimate(
        mean=math.exp(weighted / weight_sum),
        sd=math.sqrt(1.0 / weight_sum),
        starts=len(used),
        runs=sum(len(s.logs) for s in used),
        within=within,
    )


def prob_better(a: Estimate, b: Estimate, *, margin: float = 0.0) -> float:
    """P(true mean of ``a`` > true mean of ``b`` · (1 + margin)), normal on the log scale."""
    return _normal_cdf(a.log_mean - b.log_mean - math.log1p(margin), math.hypot(a.sd, b.sd))


def expected_gain(a: Estimate, ref: Estimate, start_var: float) -> float:
    """The expected (relative) gain of the better of ``a`` and ``ref`` after one more start
    of ``a`` whose own variance is ``start_var`` (log scale): the knowledge gradient.

    One start moves ``a``'s posterior mean by a normal step of sd ``s = sd² / sqrt(sd² +
    start_var)``; the gain is ``s · f(-|d| / s)`` with ``d`` the two means' log difference and
    ``f(z) = z Φ(z) + φ(z)``. It falls as ``a`` gathers starts (a third start of a rival tied
    with the pick at 3 % start noise moves little), where a probability of beating the pick
    stays near a half for ever.
    """
    if a.sd <= 0:
        return 0.0
    s = a.sd**2 / math.sqrt(a.sd**2 + max(start_var, 0.0))
    if s <= 0:
        return 0.0
    z = -abs(a.log_mean - ref.log_mean) / s
    cdf = 0.5 * math.erfc(-z / math.sqrt(2.0))
    pdf = math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi)
    return s * (z * cdf + pdf)
