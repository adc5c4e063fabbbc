"""Student's t distribution without scipy: CDF through the regularized incomplete beta function
(Lentz's continued fraction, as in Numerical Recipes ``betacf``) and quantiles by bisection.

Accurate to about 1e-10 for any real ``df > 0`` (Welch's degrees of freedom are not integers).
"""

from __future__ import annotations

import math
import statistics

_EPS = 1e-15
_TINY = 1e-300


def _betacf(a: float, b: float, x: float) -> float:
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = 1.0
    d = 1.0 - qab * x / qap
    d = _TINY if abs(d) < _TINY else d
    d = 1.0 / d
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = _TINY if abs(d) < _TINY else d
        c = 1.0 + aa / c
        c = _TINY if abs(c) < _TINY else c
        d = 1.0 / d
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = _TINY if abs(d) < _TINY else d
        c = 1.0 + aa / c
        c = _TINY if abs(c) < _TINY else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < _EPS:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)`` for ``a, b > 0``, ``0 <= x <= 1``."""
    if not (a > 0 and b > 0):
        raise ValueError(f"betainc needs a > 0 and b > 0, got a={a!r}, b={b!r}")
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"betainc needs 0 <= x <= 1, got x={x!r}")
    if x == 0.0 or x == 1.0:
        return x
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (``df = inf``: normal)."""
    if not df > 0:
        raise ValueError(f"t_cdf needs df > 0, got {df!r}")
    if math.isnan(t):
        return math.nan
    if math.isinf(df) or df > 1e8:
        return statistics.NormalDist().cdf(t)
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_sf2(t: float, df: float) -> float:
    """Two-sided p-value ``P(|T| >= |t|)``."""
    if math.isnan(t):
        return math.nan
    if math.isinf(df) or df > 1e8:
        return 2.0 * statistics.NormalDist().cdf(-abs(t))
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_ppf(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (e.g. ``t_ppf(0.975, 4) = 2.776445``).

    Raises:
        ValueError: ``p`` outside (0, 1) or ``df <= 0``.
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"t_ppf needs 0 < p < 1, got {p!r}")
    if not df > 0:
        raise ValueError(f"t_ppf needs df > 0, got {df!r}")
    if math.isinf(df) or df > 1e8:
        return statistics.NormalDist().inv_cdf(p)
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_ppf(1.0 - p, df)
    tail = 2.0 * (1.0 - p)  # two-sided tail mass to match
    lo, hi = 0.0, 1.0
    while t_sf2(hi, df) > tail:
        lo, hi = hi, hi * 2.0
        if hi > 1e300:
            return math.inf
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_sf2(mid, df) > tail:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)
