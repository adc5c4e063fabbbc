"""A smooth surface over the speculative settings: neighbours inform each other (pure numpy).

Near the top, configurations differ by about as much as one server start's noise (1-2 %), so a
configuration judged only by its own starts is mostly judged by luck. Throughput is smooth in
the speculative settings (it moves by fractions of a percent per step, per draft token, per
topk doubling), so a Gaussian process over ``(steps, log2 topk, draft tokens)`` pools the
starts of neighbouring configurations: a lucky start is pulled back by its neighbours, and a
trend (deeper is slower, here) is seen across several points instead of one.

Each start is one observation (its mean log throughput) with its own noise variance (the
between-start noise plus its run noise over its run count). The kernel is a squared
exponential with one length scale per axis plus a constant mean. With a few dozen starts no
single choice of length scales is well determined, so the prediction averages the fits of a
small grid of them, each weighted by its marginal likelihood (Bayesian model averaging): the
fit is deterministic, cheap (small Cholesky factorisations) and does not jump between
hyperparameters when one more start arrives.

A surface may also have a linear mean in some of its features (``trend``: universal kriging,
the coefficients fitted by generalised least squares and their uncertainty kept in every
prediction): the cycle time's surface (``_history``), whose cost form is linear in the draft
steps and tokens. :meth:`Surface.predict_joint` gives the posterior covariance of several
settings, for differences between neighbours that rest on the same starts.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rayspec._types import SpecSettings

__all__ = ["Surface", "spec_features"]

# Length scales tried per axis (steps, log2 topk, draft tokens) and signal sds (log scale).
_LENGTHS_STEPS = (0.75, 1.5, 3.0, 6.0)
_LENGTHS_TOPK = (0.75, 1.5)
_LENGTHS_TOKENS = (1.0, 2.0, 4.0, 8.0)
_SIGNAL_SD = (0.02, 0.05, 0.1)
_JITTER = 1e-9
_MIN_WEIGHT = 1e-4  # fits this much less likely than the best are dropped from the average


def spec_features(spec: SpecSettings) -> tuple[float, float, float]:
    """The point of a speculative setting on the surface: steps, log2(topk), draft tokens."""
    return (float(spec.num_steps), math.log2(spec.eagle_topk), float(spec.num_draft_tokens))


@dataclass(frozen=True)
class _Fit:
    x: np.ndarray
    alpha: np.ndarray
    chol: np.ndarray
    mean: float
    lengths: np.ndarray
    signal: float
    log_ml: float
    trend: _Trend | None = None


@dataclass(frozen=True)
class _Trend:
    """A linear mean's fit (universal kriging): its coefficients on ``[1, x[cols]]``, the
    columns used, ``chol`` applied to the basis (``L^-1 H``) and the coefficients' precision
    ``H' K^-1 H``."""

    beta: np.ndarray
    cols: tuple[int, ...]
    whitened: np.ndarray
    precision: np.ndarray


def _kernel(a: np.ndarray, b: np.ndarray, lengths: np.ndarray, signal: float) -> np.ndarray:
    d = (a[:, None, :] - b[None, :, :]) / lengths
    out: np.ndarray = signal**2 * np.exp(-0.5 * np.sum(d * d, axis=-1))
    return out


class Surface:
    """A Gaussian-process posterior over the speculative settings of one NCCL environment.

    Args:
        features: each observation's point (:func:`spec_features`).
        values: each observation's mean log throughput.
        noise_var: each observation's noise variance (log scale).

    Example::

        s = Surface([(2, 2, 6), (3, 2, 6)], [4.60, 4.59], [2e-4, 2e-4])
        s.predict([(2, 2, 6)])   # (means, sds), pooled with the neighbour
    """

    def __init__(
        self,
        features: Sequence[tuple[float, float, float]],
        values: Sequence[float],
        noise_var: Sequence[float],
        *,
        trend: Sequence[int] = (),
        signals: Sequence[float] = _SIGNAL_SD,
    ) -> None:
        x = np.asarray(features, dtype=float).reshape(-1, 3)
        y = np.asarray(values, dtype=float)
        v = np.asarray(noise_var, dtype=float)
        if not (len(x) == len(y) == len(v)) or len(x) == 0:
            raise ValueError("features, values and noise_var must be equally long and non-empty")
        cols = _identified(x, trend)
        fits: list[_Fit] = []
        for ls, lt, ln, sf in itertools.product(
            _LENGTHS_STEPS, _LENGTHS_TOPK, _LENGTHS_TOKENS, signals
        ):
            lengths = np.array([ls, lt, ln])
            fit = _fit_trend(x, y, v, lengths, sf, cols) if cols else _fit(x, y, v, lengths, sf)
            if fit is not None:
                fits.append(fit)
        if not fits:  # pragma: no cover - the jittered matrix is positive definite
            raise ValueError("no surface could be fitted")
        top = max(f.log_ml for f in fits)
        weights = np.array([math.exp(f.log_ml - top) for f in fits])
        keep = weights > _MIN_WEIGHT * weights.max()
        self._fits = [f for f, k in zip(fits, keep, strict=True) if k]
        w = weights[keep]
        self._weights = w / w.sum()

    @property
    def lengths(self) -> tuple[float, float, float]:
        """The most likely length scales (steps, log2 topk, draft tokens)."""
        ls = self._fits[int(np.argmax(self._weights))].lengths
        return (float(ls[0]), float(ls[1]), float(ls[2]))

    def predict(
        self, features: Sequence[tuple[float, float, float]]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Posterior means and sds (log scale) of the noise-free surface at ``features``."""
        means, cov = self.predict_joint(features)
        return means, np.sqrt(np.maximum(np.diag(cov), 0.0))

    def predict_joint(
        self, features: Sequence[tuple[float, float, float]]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Posterior means and their covariance matrix at ``features``: two neighbours'
        values rest on the same starts, so their difference is surer than their sds say."""
        xs = np.asarray(features, dtype=float).reshape(-1, 3)
        first = np.zeros(len(xs))
        second = np.zeros((len(xs), len(xs)))
        for f, weight in zip(self._fits, self._weights, strict=True):
            ks = _kernel(xs, f.x, f.lengths, f.signal)
            w = np.linalg.solve(f.chol, ks.T)
            cov = _kernel(xs, xs, f.lengths, f.signal) - w.T @ w
            np.fill_diagonal(cov, np.maximum(np.diag(cov), 0.0))
            if f.trend is None:
                mean = f.mean + ks @ f.alpha
            else:  # the trend's own uncertainty: u' (H' K^-1 H)^-1 u, u = h - H' K^-1 k
                t = f.trend
                h = _basis(xs, t.cols)
                mean = h @ t.beta + ks @ f.alpha
                u = h.T - t.whitened.T @ w
                cov = cov + u.T @ np.linalg.solve(t.precision, u)
            first += weight * mean
            second += weight * (cov + np.outer(mean, mean))
        return first, second - np.outer(first, first)


def _cholesky(
    x: np.ndarray, v: np.ndarray, lengths: np.ndarray, signal: float
) -> np.ndarray | None:
    """The lower Cholesky factor of the observations' covariance (None: not positive)."""
    try:
        return np.linalg.cholesky(_kernel(x, x, lengths, signal) + np.diag(v + _JITTER))
    except np.linalg.LinAlgError:
        return None


def _fit(
    x: np.ndarray, y: np.ndarray, v: np.ndarray, lengths: np.ndarray, signal: float
) -> _Fit | None:
    # A constant prior mean, estimated by generalised least squares inside the likelihood.
    chol = _cholesky(x, v, lengths, signal)
    if chol is None:
        return None
    ones = np.ones_like(y)
    ki_y = np.linalg.solve(chol.T, np.linalg.solve(chol, y))
    ki_1 = np.linalg.solve(chol.T, np.linalg.solve(chol, ones))
    mean = float(ones @ ki_y / (ones @ ki_1))
    r = y - mean
    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, r))
    log_ml = float(-0.5 * r @ alpha - np.sum(np.log(np.diag(chol))))
    return _Fit(x, alpha, chol, mean, lengths, signal, log_ml)


def _basis(x: np.ndarray, cols: Sequence[int]) -> np.ndarray:
    return np.column_stack([np.ones(len(x)), *(x[:, c] for c in cols)])


def _identified(x: np.ndarray, trend: Sequence[int]) -> tuple[int, ...]:
    """The trend's columns the data can fit: each must vary, and the basis must leave at
    least two observations beyond its coefficients (one more column is dropped until so)."""
    cols = [c for c in trend if np.ptp(x[:, c]) > 0]
    while cols and (
        np.linalg.matrix_rank(_basis(x, cols)) < len(cols) + 1 or len(x) < len(cols) + 3
    ):
        cols.pop()
    return tuple(cols)


def _fit_trend(
    x: np.ndarray,
    y: np.ndarray,
    v: np.ndarray,
    lengths: np.ndarray,
    signal: float,
    cols: tuple[int, ...],
) -> _Fit | None:
    # A linear mean on [1, x[cols]] by generalised least squares; the restricted likelihood
    # (the coefficients integrated out) weighs the fits.
    chol = _cholesky(x, v, lengths, signal)
    if chol is None:
        return None
    h = _basis(x, cols)
    wh = np.linalg.solve(chol, h)
    wy = np.linalg.solve(chol, y)
    precision = wh.T @ wh
    try:
        beta = np.linalg.solve(precision, wh.T @ wy)
        sign, logdet = np.linalg.slogdet(precision)
    except np.linalg.LinAlgError:
        return None
    if sign <= 0:
        return None
    r = y - h @ beta
    alpha = np.linalg.solve(chol.T, np.linalg.solve(chol, r))
    log_ml = float(-0.5 * r @ alpha - np.sum(np.log(np.diag(chol))) - 0.5 * logdet)
    return _Fit(x, alpha, chol, 0.0, lengths, signal, log_ml,
                _Trend(beta, cols, wh, precision))  # fmt: skip
