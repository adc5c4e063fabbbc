"""What the measurements say about each configuration, with the noise that is really there.

A configuration (a *point*) is measured in one or more server *starts*; each start gives several
runs. Two noises add up (docs/twin-model.md, *Noise*, and real servers alike):

- within a start, run to run (acceptance draws, timing jitter): estimated from the runs;
- between starts of the same configuration (clocks, thermals, placement): invisible inside one
  start, so it is estimated from the configurations that were started more than once, pooled,
  with a prior (``study.start_noise``, 1 % by default) that holds until such data exist.

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

__all__ = ["Estimate", "Noise", "Start", "estimate", "estimate_noise", "prob_better"]

# Degrees of freedom the priors count for: a point's within-start variance is shrunk towards
# the pooled one with this weight, and the between-start prior weighs as much as this many
# repeated starts.
_WITHIN_PRIOR_DF = 2.0
_BETWEEN_PRIOR_DF = 3.0
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
    """

    within: float
    between: float
    between_df: float


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


def _within_var(starts: Sequence[Start]) -> tuple[float, float]:
    """Sum of squared deviations from each start's mean, and its degrees of freedom."""
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
        s, d = _within_var(starts)
        ss, df = ss + s, df + d
    return math.sqrt(ss / df) if df > 0 else 0.02


def _point_within(starts: Sequence[Start], pooled: float) -> float:
    ss, df = _within_var(starts)
    var = (ss + _WITHIN_PRIOR_DF * pooled**2) / (df + _WITHIN_PRIOR_DF)
    return max(math.sqrt(var), _MIN_WITHIN)


def estimate_noise(groups: Mapping[str, Sequence[Start]], *, prior_between: float = 0.01) -> Noise:
    """Pool the within-start and between-start noise over every measured point.

    Args:
        groups: each point's starts.
        prior_between: the between-start relative sd assumed before repeated starts exist.
    """
    pooled = _pooled_within(groups)
    num = _BETWEEN_PRIOR_DF * prior_between**2
    df = _BETWEEN_PRIOR_DF
    for starts in groups.values():
        means = [(sum(s.logs) / len(s.logs), len(s.logs)) for s in starts if s.logs]
        if len(means) < 2:
            continue
        within = _point_within(starts, pooled)
        grand = sum(m for m, _ in means) / len(means)
        spread = sum((m - grand) ** 2 for m, _ in means) / (len(means) - 1)
        expected = sum(within**2 / n for _, n in means) / len(means)
        # Method of moments: what the start means vary by beyond their own run noise.
        num += (len(means) - 1) * max(0.0, spread - expected)
        df += len(means) - 1
    between = max(math.sqrt(num / df), prior_between / 4)
    return Noise(within=pooled, between=between, between_df=df)


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
    diff = a.log_mean - b.log_mean - math.log1p(margin)
    sd = math.hypot(a.sd, b.sd)
    if sd == 0:
        return 1.0 if diff > 0 else 0.0
    return 0.5 * math.erfc(-diff / (sd * math.sqrt(2.0)))
