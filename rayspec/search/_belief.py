"""The search's one belief: a joint normal posterior over the log throughput of every
configuration it could launch or deploy (pure numpy).

What a start of configuration ``c`` measures (its runs' mean log tok/s) is::

    y = f(c) + b + e        b ~ N(0, sigma_b²): the start's offset
                            e ~ N(0, within_c² / runs): its runs' noise

and the truth of a configuration on lattice ``L`` (its NCCL class, server settings and kind:
speculative, no speculation, adaptive, overlap off) is::

    f(c) = m(c) + beta_L + g(c)

- ``m``: the online model's prediction (:mod:`rayspec.search._online`: the node's acceptance and
  cycle cost, fitted from every start's histogram and rate). It is the search's *assumption* of
  the node's form, and it can be wrong: a real node's verify cost steps at graph sizes, a real
  drafter's acceptance need not fall geometrically. 0 where the model cannot say.
- ``beta_L``: the lattice's level, with a flat prior (the model's level may be off).
- ``g``: the model's discrepancy, a Gaussian process over the settings (steps, topk, draft
  tokens). Its scale ``sigma_g`` and length scale are not set: each pair of a grid is weighted
  by how well it explains the model's *leave-one-out* residuals (the model refitted without a
  configuration predicts it), so when the model stops predicting what is measured, the
  discrepancy grows and the whole belief widens by itself; where it predicts well, the belief
  narrows. A lattice with nothing measured borrows its level from a related one, within
  ``_LATTICE_SD``.
- ``sigma_b``: the between-start noise's posterior
  (:func:`~rayspec.search._posterior.between_posterior`), at its predictive variance
  ``E[sigma_b²]``: with no configuration started twice the prior's (1 %, a factor of 3 either
  way) gives a start about 3 % of its own uncertainty.

The belief is the mixture over the grid, matched to one normal (its mean and covariance), so the
decision (:func:`decide`), the value of a start (:mod:`rayspec.search._kg`) and the stop line's
probability (:meth:`Belief.rival_chance`) all read the same numbers. :meth:`Belief.prob_faster`
is the one answer to "is A faster than B".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from rayspec._types import Candidate
from rayspec._types import SpecSettings
from rayspec._types import TrialState
from rayspec.search._history import Env
from rayspec.search._history import Observation
from rayspec.search._history import _normalise
from rayspec.search._online import Measured
from rayspec.search._online import OnlineModel
from rayspec.search._online import fit_model
from rayspec.search._posterior import Noise
from rayspec.search._posterior import Start
from rayspec.search._posterior import _normal_cdf
from rayspec.search._posterior import _point_within
from rayspec.search._posterior import between_posterior
from rayspec.search._posterior import estimate_noise
from rayspec.search._space import canonical_key

__all__ = ["Belief", "Decision", "believe", "decide"]

# The discrepancy's scale and length scale: a grid, weighted by the data (Bayesian model
# averaging). The scale's prior is log-normal around _MODEL_ERROR with a factor of 3 for one sd:
# before a residual is seen, the model is taken to predict a setting within a few %.
_SCALES = (0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16)
_MODEL_ERROR = 0.02  # relative; the prior's median of the model's error at a setting
_MODEL_ERROR_LOG_SD = math.log(3.0)
_LENGTHS = (0.5, 1.0, 2.0)  # in the features' units (below): one step, a topk doubling, ...
# A lattice with nothing measured (a flag, another NCCL class) sits at a related lattice's
# level within this much (relative sd): a flag or an NCCL set moves a node by a few %.
_LATTICE_SD = 0.05
_JITTER = 1e-10
_NO_MODEL = "static"


@dataclass(frozen=True)
class Belief:
    """The joint normal belief over a set of configurations' true log throughputs.

    Attributes:
        keys: the configurations' canonical keys (their NCCL sets by class).
        candidates: the configurations, in the same order.
        mean: posterior mean log tok/s.
        cov: posterior covariance.
        measured: keys with at least one measured start.
        start_var: per key, the variance of one more start's mean log tok/s (its start offset
            plus its runs' noise over the runs a start measures).
        noise: the within- and between-start noise.
        discrepancy: the discrepancy's posterior mean scale (relative): how far the online
            model is believed to be from the node.
        model: the online model of the most-measured lattice (None: not fitted yet).
    """

    keys: tuple[str, ...]
    candidates: tuple[Candidate, ...]
    mean: np.ndarray
    cov: np.ndarray
    measured: frozenset[str]
    start_var: Mapping[str, float]
    noise: Noise
    discrepancy: float
    model: OnlineModel | None

    def index(self, key: str) -> int:
        return self.keys.index(key)

    def tok_s(self, key: str) -> float:
        """The posterior mean throughput (exp of the mean log)."""
        return math.exp(float(self.mean[self.index(key)]))

    def sd(self, key: str) -> float:
        """The posterior sd of the log throughput (relative)."""
        i = self.index(key)
        return math.sqrt(max(float(self.cov[i, i]), 0.0))

    def prob_faster(self, a: str, b: str, margin: float = 0.0) -> float:
        """P(``a`` is truly faster than ``b`` by more than ``margin`` (relative)): the one
        answer to "is A faster than B", with the two beliefs' correlation."""
        i, j = self.index(a), self.index(b)
        diff = float(self.mean[i] - self.mean[j]) - math.log1p(margin)
        var = float(self.cov[i, i] + self.cov[j, j] - 2.0 * self.cov[i, j])
        return _normal_cdf(diff, math.sqrt(max(var, 0.0)))

    def rival_chance(
        self, pick: str, band: float, *, samples: int = 4000, seed: int = 0
    ) -> tuple[float, str]:
        """P(some configuration of the belief beats ``pick`` by more than ``band``), by
        sampling the joint belief, and the rival that does so most often."""
        i = self.index(pick)
        chol = _cholesky(self.cov)
        rng = np.random.default_rng(seed)
        draws = self.mean[:, None] + chol @ rng.standard_normal((len(self.keys), samples))
        lead = draws - draws[i] - math.log1p(band)
        lead[i] = -np.inf
        beats = lead.max(axis=0) > 0
        winners = np.argmax(lead, axis=0)[beats]
        if winners.size == 0:
            return 0.0, ""
        top = int(np.bincount(winners, minlength=len(self.keys)).argmax())
        return float(beats.mean()), self.keys[top]


@dataclass(frozen=True)
class Decision:
    """What to deploy: the posterior's best, unless it is not sure enough to beat the floor.

    Attributes:
        key: the chosen configuration.
        best: the deployable configuration with the best posterior mean.
        floor: the floor it was held to (the best-believed baseline or enqueued one), if any.
        below_floor: P(the chosen one is truly below that floor).
        note: one line when the choice is not ``best``.
    """

    key: str
    best: str
    floor: str | None
    below_floor: float
    note: str = ""


def decide(
    belief: Belief,
    deployable: Iterable[str],
    floors: Iterable[str],
    *,
    risk: float = 0.025,
    margin: float = 0.0,
    cost: Mapping[str, tuple[int, int]] | None = None,
) -> Decision | None:
    """The one terminal decision (the search's, the report's and ``best.sh``'s): the
    deployable configuration with the best posterior mean whose chance of being truly below
    the best-believed floor is at most ``risk``; the floor itself when none is that sure.

    ``deployable``: measured with a complete start (and, where an SLO applies, meeting it);
    ``floors``: the baseline and the enqueued configurations among them. With ``margin > 0``
    (``study.pick_margin``, asked for explicitly) the cheapest (``cost``: fewer draft tokens,
    then steps) of the eligible ones within ``margin`` of the chosen mean is chosen instead.
    """
    options = sorted(deployable, key=lambda k: -belief.mean[belief.index(k)])
    if not options:
        return None
    best = options[0]
    floor_keys = [k for k in floors if k in options]
    floor = max(floor_keys, key=lambda k: belief.mean[belief.index(k)]) if floor_keys else None
    if floor is None:
        floor = best  # no floor: nothing to be below
    eligible = [k for k in options if k == floor or belief.prob_faster(floor, k) <= risk]
    key, note = eligible[0], ""
    if key != best:
        note = (
            f"the best mean ({belief.tok_s(best):.1f} tok/s) is below the floor with "
            f"{belief.prob_faster(floor, best):.1%} probability (at most {risk:.1%} allowed): "
            "picked the best that is not"
        )
    if margin > 0 and cost is not None:
        limit = belief.mean[belief.index(key)] + math.log1p(-margin)
        near = [k for k in eligible if belief.mean[belief.index(k)] >= limit]
        cheapest = min(near, key=lambda k: (cost.get(k, (0, 0)), -belief.mean[belief.index(k)]))
        if cheapest != key:
            key, note = (
                cheapest,
                (
                    f"within {margin:.0%} of the best eligible mean and cheaper (fewer draft "
                    "tokens / steps): picked, as study.pick_margin asks"
                ),
            )
    below = 0.0 if key == floor else belief.prob_faster(floor, key)
    return Decision(key, best, floor if floor_keys else None, below, note)


# -- building the belief --------------------------------------------------------------------


def _kind(spec: SpecSettings | None) -> str:
    if spec is None:
        return "off"
    if spec.adaptive:
        return "adaptive"
    return _NO_MODEL if spec.overlap else "overlap-off"


Lattice = tuple[Env, tuple[str, ...], str]


def _lattice(candidate: Candidate) -> Lattice:
    return (candidate.nccl_env, candidate.server_settings, _kind(candidate.spec))


def _features(spec: SpecSettings | None) -> tuple[float, float, float]:
    """A setting's place for the discrepancy: steps / 1.5, log2 topk, draft tokens / 3 (one
    unit: about the distance over which throughput moves by its own noise). No speculation is
    far from every setting: the model's error there is its own."""
    if spec is None:
        return (-100.0, 0.0, 0.0)
    return (spec.num_steps / 1.5, math.log2(spec.eagle_topk), spec.num_draft_tokens / 3.0)


@dataclass(frozen=True)
class _Data:
    """One measured configuration: its starts' pooled mean and variance."""

    y: float
    var: float
    start_var: float


def _measured_rows(
    groups: Mapping[str, list[Start]], noise: Noise, sigma_b2: float, runs: int
) -> dict[str, _Data]:
    out: dict[str, _Data] = {}
    for key, starts in groups.items():
        used = [s for s in starts if s.logs]
        if not used:
            continue
        within = _point_within(used, noise.within)
        precision, weighted = 0.0, 0.0
        for s in used:
            logs = s.logs
            v = sigma_b2 + within**2 / len(logs)
            precision += 1.0 / v
            weighted += sum(logs) / len(logs) / v
        out[key] = _Data(weighted / precision, 1.0 / precision, sigma_b2 + within**2 / runs)
    return out


def _model_of(
    spec_starts: Sequence[tuple[SpecSettings, Start, tuple[int, ...]]],
) -> OnlineModel | None:
    measured = [
        Measured(spec, math.exp(sum(s.logs) / len(s.logs)), hist)
        for spec, s, hist in spec_starts
        if s.logs and hist and spec.eagle_topk >= 1 and not spec.adaptive
    ]
    return fit_model(measured) if measured else None


def _log_predict(model: OnlineModel | None, spec: SpecSettings | None) -> float | None:
    if model is None:
        return None
    if spec is None:  # the cost form at no draft: one decode step
        return math.log(1000.0 / model.costs.c0) if model.costs.c0 > 0 else None
    if not spec.overlap:
        return None
    tok_s = model.predict(spec)
    return math.log(tok_s) if tok_s is not None and tok_s > 0 else None


def _kernel(a: np.ndarray, b: np.ndarray, length: float) -> np.ndarray:
    d = (a[:, None, :] - b[None, :, :]) / length
    out: np.ndarray = np.exp(-0.5 * np.sum(d * d, axis=-1))
    return out


def _cholesky(m: np.ndarray) -> np.ndarray:
    jitter = _JITTER * max(1.0, float(np.max(np.abs(np.diag(m)))) if m.size else 1.0)
    for _ in range(8):
        try:
            out: np.ndarray = np.linalg.cholesky(m + jitter * np.eye(len(m)))
            return out
        except np.linalg.LinAlgError:
            jitter *= 100.0
    w, v = np.linalg.eigh(m)
    fixed: np.ndarray = v * np.sqrt(np.clip(w, 0.0, None))
    return fixed


def _restricted_loglik(r: np.ndarray, k: np.ndarray, var: np.ndarray) -> float:
    """log p(r) for r = beta 1 + g + noise with beta flat (REML): what a scale explains."""
    if r.size < 2:
        return 0.0
    c = _cholesky(k + np.diag(var))
    ones = np.ones(len(r))
    ci_r = np.linalg.solve(c, r)
    ci_1 = np.linalg.solve(c, ones)
    s = float(ci_1 @ ci_1)
    beta = float(ci_1 @ ci_r) / s
    resid = ci_r - beta * ci_1
    return float(-0.5 * resid @ resid - np.sum(np.log(np.diag(c))) - 0.5 * math.log(s))


def _posterior(
    xd: np.ndarray,
    rd: np.ndarray,
    vd: np.ndarray,
    xq: np.ndarray,
    scale: float,
    length: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Universal kriging with a constant (flat): the residual's posterior mean and covariance
    at ``xq``."""
    kqq = scale**2 * _kernel(xq, xq, length)
    c = _cholesky(scale**2 * _kernel(xd, xd, length) + np.diag(vd))
    kqd = scale**2 * _kernel(xq, xd, length)
    a = np.linalg.solve(c, kqd.T)  # L^-1 K_dq
    ones = np.ones(len(rd))
    ci_r = np.linalg.solve(c, rd)
    ci_1 = np.linalg.solve(c, ones)
    s = float(ci_1 @ ci_1)
    beta = float(ci_1 @ ci_r) / s
    u = 1.0 - a.T @ ci_1  # what the level's uncertainty adds at each query
    mean = beta + a.T @ (ci_r - beta * ci_1)
    cov = kqq - a.T @ a + np.outer(u, u) / s
    return mean, cov


def believe(
    observations: Iterable[Observation],
    *,
    start_noise: float = 0.01,
    equivalent: Callable[[Env], Env] | None = None,
    extra: Sequence[Candidate] = (),
    runs: int = 5,
) -> Belief:
    """The belief over every measured configuration and the ``extra`` unmeasured ones.

    Args:
        observations: the finished trials.
        start_noise: the between-start sd's prior median (``study.start_noise``).
        equivalent: the NCCL screen's classes (sets it cannot tell apart are one).
        extra: configurations to believe about though unmeasured (what could be launched).
        runs: the runs one more start would measure (the protocol's repeats).
    """
    same = equivalent or (lambda env: env)
    groups: dict[str, list[Start]] = {}
    cands: dict[str, Candidate] = {}
    hist: dict[int, tuple[int, ...]] = {}
    for o in observations:
        if not o.measured:
            continue
        cand = _normalise(o.candidate, same)
        key = canonical_key(cand)
        runs_ = tuple(v for v in o.runs if v > 0 and math.isfinite(v))
        groups.setdefault(key, []).append(Start(o.trial, runs_))
        cands.setdefault(key, cand)
        if o.accept_histogram and o.state is not TrialState.FAIL:
            hist[o.trial] = o.accept_histogram
    for c in extra:
        cand = _normalise(c, same)
        cands.setdefault(canonical_key(cand), cand)
    noise = estimate_noise(groups, prior_between=start_noise)
    posterior = between_posterior(groups, prior_between=start_noise)
    sigma_b2 = sum(p * s * s for s, p in posterior)
    data = _measured_rows(groups, noise, sigma_b2, runs)
    keys = tuple(cands)
    # One online model per NCCL class and server settings, from its speculative starts.
    spec_starts: dict[tuple[Env, tuple[str, ...]], list[tuple[SpecSettings, Start, str]]] = {}
    for key in keys:
        cand = cands[key]
        if cand.spec is None or _kind(cand.spec) != _NO_MODEL:
            continue
        rows = spec_starts.setdefault((cand.nccl_env, cand.server_settings), [])
        rows += [(cand.spec, s, key) for s in groups.get(key, []) if s.trial in hist]
    models = {
        site: _model_of([(sp, s, hist[s.trial]) for sp, s, _ in rows])
        for site, rows in spec_starts.items()
    }
    lattices: dict[Lattice, list[str]] = {}
    for key in keys:
        cand = cands[key]
        lattice = _lattice(cand)
        # No speculation joins its speculative settings where a model relates them (one
        # decode step is the cost form's c0): an accept length near 1 then cannot beat it.
        if cand.spec is None and models.get((cand.nccl_env, cand.server_settings)) is not None:
            lattice = (lattice[0], lattice[1], _NO_MODEL)
        lattices.setdefault(lattice, []).append(key)
    prior: dict[str, float] = {}
    loo: dict[str, float] = {}
    for key in keys:
        cand = cands[key]
        model = models.get((cand.nccl_env, cand.server_settings))
        m = _log_predict(model, cand.spec)
        prior[key] = 0.0 if m is None else m
        rows = spec_starts.get((cand.nccl_env, cand.server_settings), [])
        if key in data and m is not None and (cand.spec is None or _kind(cand.spec) == _NO_MODEL):
            rest = [(sp, s, hist[s.trial]) for sp, s, k in rows if k != key]
            m_loo = _log_predict(_model_of(rest), cand.spec) if rest else None
            if m_loo is not None:
                loo[key] = data[key].y - m_loo
    # The discrepancy's hyperparameters: weighted by the leave-one-out residuals' likelihood.
    hypers = [(s, ell) for s in _SCALES for ell in _LENGTHS]
    logw = []
    for scale, ell in hypers:
        lw = -0.5 * ((math.log(scale) - math.log(_MODEL_ERROR)) / _MODEL_ERROR_LOG_SD) ** 2
        for members in lattices.values():
            held = [k for k in members if k in loo]
            if len(held) >= 2:
                x = np.array([_features(cands[k].spec) for k in held])
                r = np.array([loo[k] for k in held])
                v = np.array([data[k].var for k in held])
                lw += _restricted_loglik(r, scale**2 * _kernel(x, x, ell), v)
        logw.append(lw)
    top = max(logw)
    weights = np.exp(np.array(logw) - top)
    weights /= weights.sum()
    # The posterior per lattice, mixed over the grid and matched to one normal.
    n = len(keys)
    mean = np.zeros(n)
    cov = np.zeros((n, n))
    index = {k: i for i, k in enumerate(keys)}
    levels: dict[Lattice, tuple[float, float]] = {}
    later: list[tuple[Lattice, list[str]]] = []
    for lattice, members in lattices.items():
        measured = [k for k in members if k in data]
        if not measured:
            later.append((lattice, members))
            continue
        xq = np.array([_features(cands[k].spec) for k in members])
        xd = np.array([_features(cands[k].spec) for k in measured]).reshape(-1, 3)
        rd = np.array([data[k].y - prior[k] for k in measured])
        vd = np.array([data[k].var for k in measured])
        m1 = np.zeros(len(members))
        m2 = np.zeros((len(members), len(members)))
        total = 0.0
        for w, (scale, ell) in zip(weights, hypers, strict=True):
            if w < 1e-6:
                continue
            mu, sig = _posterior(xd, rd, vd, xq, scale, ell)
            m1 += w * mu
            m2 += w * (sig + np.outer(mu, mu))
            total += w
        m1 /= total
        idx = [index[k] for k in members]
        mean[idx] = m1 + np.array([prior[k] for k in members])
        cov[np.ix_(idx, idx)] = m2 / total - np.outer(m1, m1)
        at = [index[k] for k in measured]
        levels[lattice] = (float(np.mean(mean[at])), float(np.mean(np.diag(cov)[at])))
    # A lattice with nothing measured (adaptive steps, overlap off, a flag, another NCCL class):
    # each member sits at its static counterpart's belief, all of them shifted together by one
    # unknown offset of _LATTICE_SD (what the mode or flag does to this node).
    for lattice, members in later:
        idx = [index[k] for k in members]
        bases = [index.get(canonical_key(_normalise(_base(cands[k]), same))) for k in members]
        if all(b is not None and _lattice(cands[keys[b]]) in levels for b in bases):
            b = [int(x) for x in bases if x is not None]
            mean[idx] = mean[b]
            cov[np.ix_(idx, range(n))] = cov[b, :]
            cov[np.ix_(range(n), idx)] = cov[:, b]
            cov[np.ix_(idx, idx)] = cov[np.ix_(b, b)] + _LATTICE_SD**2
        else:
            level, var = _related_level(lattice, levels)
            mean[idx] = level
            cov[np.ix_(idx, idx)] = var + _LATTICE_SD**2 + np.eye(len(idx)) * _MODEL_ERROR**2
    scale_mean = float(sum(w * s for w, (s, _) in zip(weights, hypers, strict=True)))
    main = max(models.items(), key=lambda kv: len(spec_starts.get(kv[0], [])), default=None)
    start_var = {k: d.start_var for k, d in data.items()}
    unmeasured_var = sigma_b2 + noise.within**2 / runs
    for k in keys:
        start_var.setdefault(k, unmeasured_var)
    return Belief(
        keys=keys,
        candidates=tuple(cands[k] for k in keys),
        mean=mean,
        cov=(cov + cov.T) / 2.0,
        measured=frozenset(data),
        start_var=start_var,
        noise=noise,
        discrepancy=scale_mean,
        model=main[1] if main else None,
    )


def _base(candidate: Candidate) -> Candidate:
    """The static configuration a mode or a flag is a variation of: adaptive steps' starting
    chain, a chain with the overlap scheduler on, the configuration without flags or knobs."""
    spec = candidate.spec
    if spec is not None and spec.adaptive:
        spec = SpecSettings(spec.algorithm, spec.num_steps, 1, spec.num_steps + 1)
    elif spec is not None and not spec.overlap:
        spec = dataclasses.replace(spec, overlap=True)
    return Candidate(nccl_env=candidate.nccl_env, spec=spec)


def _related_level(
    lattice: Lattice, levels: Mapping[Lattice, tuple[float, float]]
) -> tuple[float, float]:
    """The level (mean log tok/s of its measured members, and their variance) an unmeasured
    lattice without a static counterpart borrows: the same NCCL class and settings', else the
    same class's, else any."""
    env, settings, _ = lattice
    for cond in (
        lambda la: la[0] == env and la[1] == settings,
        lambda la: la[0] == env,
        lambda la: True,
    ):
        for la, (level, var) in levels.items():
            if cond(la):
                return level, var
    return 0.0, 1e6  # nothing measured anywhere: no level to speak of
