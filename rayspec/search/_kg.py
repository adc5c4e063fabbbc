"""The knowledge gradient of more server starts, for correlated normal beliefs (pure numpy).

The textbook value-of-information rule for ranking and selection (Frazier, Powell and Dayanik,
*The knowledge-gradient policy for correlated normal beliefs*, 2009): with a joint normal belief
over the configurations' log throughputs, ``m`` more starts of configuration ``x`` move every
posterior mean along one line, ``mu_i + s_i Z`` with ``Z ~ N(0, 1)`` and
``s = Sigma[:, x] / sqrt(Sigma[x, x] + lam / m)`` (``lam``: the variance of what one start
measures), and shrink the covariance by ``s s'``, whatever ``Z`` turns out to be. The value of
the starts is the expected rise of what would then be deployed.

What is deployed is the decision's (:func:`rayspec.search._belief.decide`): the best mean among
the configurations that are, after the starts, at most ``risk`` likely to be below the floor.
That constraint is linear in ``Z`` for each line (the shrunk covariance does not depend on
``Z``), so the deployed value is a piecewise-linear function of ``Z``, integrated here on a
fine grid. A configuration measured once, held back by the floor, thus has the value of the
start that would let it be deployed.

One start can be worth little while several are worth much (two close configurations need
several starts each to be told apart): :func:`kg_star` is KG(*), the best value per start over
a few starts of ``x`` taken together (Frazier and Powell's remedy for the KG's non-concavity).

Everything is on the log scale, so a value is a relative throughput gain (0.01: 1 %).
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np

__all__ = ["deployed_value", "kg_star"]

_Z = np.linspace(-6.0, 6.0, 241)  # the grid Z is integrated on
_W = np.exp(-0.5 * _Z * _Z)
_W /= _W.sum()


def deployed_value(
    means: np.ndarray,
    cov: np.ndarray,
    x: int,
    noise_var: float,
    *,
    floor: int | None,
    risk: float,
    eligible_after: np.ndarray,
) -> float:
    """E[the deployed mean after a measurement of ``x`` with variance ``noise_var``].

    Args:
        means, cov: the belief over the pool (the deployable configurations, ``x`` among them).
        x: the measured one's index in the pool.
        floor: the floor's index (None: no floor; the best mean is deployed).
        risk: the most a deployed configuration may be likely to be below the floor.
        eligible_after: which of the pool may be deployed once measured (all measured ones,
            and ``x``).
    """
    scale = math.sqrt(max(float(cov[x, x]) + noise_var, 1e-300))
    s = cov[:, x] / scale
    lines = means[:, None] + s[:, None] * _Z[None, :]  # pool x grid
    ok = np.broadcast_to(eligible_after[:, None], lines.shape).copy()
    if floor is not None:
        shrunk = cov - np.outer(s, s)
        var = np.diag(shrunk) + shrunk[floor, floor] - 2.0 * shrunk[:, floor]
        z = NormalDist().inv_cdf(1.0 - risk)
        gap = lines - lines[floor]
        ok &= gap >= z * np.sqrt(np.clip(var, 0.0, None))[:, None]
        ok[floor] = True
    best = np.where(ok, lines, -np.inf).max(axis=0)
    return float(np.sum(_W * best))


def kg_star(
    means: np.ndarray,
    cov: np.ndarray,
    x: int,
    start_var: float,
    *,
    now: float,
    floor: int | None,
    risk: float,
    eligible_after: np.ndarray,
    max_starts: int = 4,
) -> tuple[float, int]:
    """KG(*): the best expected rise of the deployed mean per start of ``x``, over
    1..``max_starts`` starts of it together.

    Args:
        now: the deployed mean now (the decision's).
        start_var: the variance of what one start of ``x`` measures (its start offset plus its
            runs' noise over the run count); ``m`` starts measure ``start_var / m``.

    Returns:
        (value per start, the number of starts that gives it).
    """
    best, starts = 0.0, 1
    for m in range(1, max_starts + 1):
        after = deployed_value(
            means, cov, x, start_var / m, floor=floor, risk=risk, eligible_after=eligible_after
        )
        value = (after - now) / m
        if value > best:
            best, starts = value, m
    return best, starts
