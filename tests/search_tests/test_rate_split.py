"""A floor is judged through the rate's split: accept lengths free of start noise, and a cycle
time whose start noise neighbours share.

The nodes here are generated, not listed: a rate is ``1000 x accept length / cycle ms`` with
the cycle linear in draft tokens and steps; each server start scales every cycle of its runs
by its own offset (3 %: three times the prior's), each run (10 per start, as the field
protocol extends a contender's) draws its own acceptance (4 %) and timing (0.3 %). The search
never sees the truth; the tests count what its pick does over many such nodes.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from rayspec import Candidate
from rayspec import SpecSettings
from rayspec._types import TrialState
from rayspec.search import Observation
from rayspec.search import Point
from rayspec.search import pick
from rayspec.search import weigh
from rayspec.search._surface import Surface

pytestmark = pytest.mark.slow  # many simulated studies: out of the fast lane

LL_SYS = (("NCCL_P2P_LEVEL", "SYS"), ("NCCL_PROTO", "LL"))
START_SD, ACCEPT_SD, TIME_SD = 0.03, 0.04, 0.003


def _spec(k: int, m: int, n: int) -> SpecSettings:
    return SpecSettings("EAGLE3", k, m, n)


# (steps, topk, draft tokens) -> true accept length; the cycle is 50 + 0.8 (N - 1) + 1.5 k ms.
LENGTHS = {(2, 1, 3): 1.87, (2, 4, 6): 2.05, (2, 4, 7): 2.06, (2, 2, 5): 1.98, (3, 4, 7): 2.12}


def _cycle_ms(k: int, n: int) -> float:
    return 50.0 + 0.8 * (n - 1) + 1.5 * k


def true_rate(key: tuple[int, int, int]) -> float:
    return 1000.0 * LENGTHS[key] / _cycle_ms(key[0], key[2])


def _start(trial: int, key: tuple[int, int, int], rng: random.Random, *, role: str = "",
           accept: bool = True, runs: int = 10) -> Observation:  # fmt: skip
    offset = 1.0 + rng.gauss(0.0, START_SD)
    lengths = [LENGTHS[key] * (1.0 + rng.gauss(0.0, ACCEPT_SD)) for _ in range(runs)]
    cycles = [_cycle_ms(key[0], key[2]) * offset * (1.0 + rng.gauss(0.0, TIME_SD))
              for _ in range(runs)]  # fmt: skip
    rates = tuple(1000.0 * n / c for n, c in zip(lengths, cycles, strict=True))
    cand = Candidate(nccl_env=LL_SYS, spec=_spec(*key))
    length = sum(lengths) / runs if accept else math.nan
    return Observation(trial, cand, TrialState.COMPLETE, rates, role=role, accept_length=length)


def _baseline(rng: random.Random) -> Observation:
    runs = tuple(30.0 * (1.0 + rng.gauss(0.0, TIME_SD)) for _ in range(5))
    return Observation(0, Candidate(), TrialState.COMPLETE, runs, role="baseline")


FLOOR, BEST = (2, 1, 3), (2, 4, 6)
PLAN = [FLOOR, BEST, FLOOR, BEST, (2, 4, 7), (2, 2, 5), (3, 4, 7), FLOOR, BEST]


def _study(seed: int, *, accept: bool) -> list[Observation]:
    """The same node and draws with or without the accept lengths reported."""
    rng = random.Random(seed)
    out = [_baseline(rng)]
    for trial, key in enumerate(PLAN, start=1):
        role = "enqueued[0]" if key == FLOOR and trial == 1 else ""
        out.append(_start(trial, key, rng, role=role, accept=accept))
    return out


def _key(p: Point) -> tuple[int, int, int]:
    assert p.candidate.spec is not None
    s = p.candidate.spec
    return (s.num_steps, s.eagle_topk, s.num_draft_tokens)


def test_accept_lengths_judge_a_floor_closer_to_the_truth_and_never_below_it() -> None:
    """Three starts of the floor and of the best tree (5 % faster), one of three more trees,
    at 3 % start noise, over 40 generated nodes. The rate's surface pools the chain and the
    trees with the start noise in every value, and shrinks the tree's lead over the floor; the
    split carries the lead in the accept lengths, which no start moves. So the split's lead is
    closer to the truth (smaller bias and error), and the pick leaves the floor on more nodes;
    neither ever picks a setting truly below the floor."""
    floor = true_rate(FLOOR)
    truth = math.log(true_rate(BEST) / floor)
    errors: dict[bool, list[float]] = {True: [], False: []}
    left = {True: 0, False: 0}
    for seed in range(40):
        for accept in (True, False):
            evidence = weigh(_study(seed, accept=accept), start_noise=0.01)
            by_key = {_key(p): p for p in evidence.points.values() if p.candidate.spec}
            lead, _ = evidence.difference(by_key[BEST], by_key[FLOOR])
            errors[accept].append(lead - truth)
            choice = pick(evidence.points, difference=evidence.difference)
            assert choice is not None
            assert choice.point.candidate.spec is not None
            assert true_rate(_key(choice.point)) >= floor
            left[accept] += not choice.point.floor
    bias = {a: abs(float(np.mean(e))) for a, e in errors.items()}
    rmse = {a: float(np.sqrt(np.mean(np.square(e)))) for a, e in errors.items()}
    assert bias[True] + 0.005 < bias[False], bias
    assert rmse[True] < rmse[False], rmse
    assert left[True] >= left[False] + 4, left


def test_the_difference_is_antisymmetric_and_falls_back_without_accept_lengths() -> None:
    for seed in range(5):
        evidence = weigh(_study(seed, accept=True), start_noise=0.01)
        points = [p for p in evidence.points.values() if p.candidate.spec is not None]
        a, b = points[0], points[1]
        d_ab, sd_ab = evidence.difference(a, b)
        d_ba, sd_ba = evidence.difference(b, a)
        assert math.isclose(d_ab, -d_ba, abs_tol=1e-12) and math.isclose(sd_ab, sd_ba)
        assert sd_ab > 0
        plain = weigh(_study(seed, accept=False), start_noise=0.01)
        pa, pb = plain.points[a.key], plain.points[b.key]
        d, sd = plain.difference(pa, pb)
        assert d == pa.estimate.log_mean - pb.estimate.log_mean
        assert sd == math.hypot(pa.estimate.sd, pb.estimate.sd)


def test_a_linear_trend_is_recovered_and_the_joint_posterior_is_consistent() -> None:
    """A cycle surface with a linear mean: on data from a linear cost it predicts the far
    corner closer than a constant mean does; its joint covariance is symmetric, positive
    semi-definite, and its diagonal is ``predict``'s variance."""
    rng = random.Random(3)
    design = [(k, t, n) for k, t, n in [(2, 0, 3), (2, 2, 6), (3, 2, 7), (2, 1, 5), (3, 0, 4)]]
    feats, ys = [], []
    for x in design:
        for _ in range(2):
            feats.append((float(x[0]), float(x[1]), float(x[2])))
            ys.append(_cycle_ms(x[0], x[2]) / 55.0 * (1.0 + rng.gauss(0.0, 0.005)))
    var = [0.005**2] * len(ys)
    far = [(6.0, 2.0, 14.0)]
    truth = _cycle_ms(6, 14) / 55.0
    trended = Surface(feats, ys, var, trend=(0, 2), signals=(0.005, 0.01, 0.02))
    flat = Surface(feats, ys, var)
    assert abs(trended.predict(far)[0][0] - truth) < 0.5 * abs(flat.predict(far)[0][0] - truth)
    xs = [*far, (2.0, 2.0, 6.0), (2.0, 0.0, 3.0)]
    means, cov = trended.predict_joint(xs)
    _, sds = trended.predict(xs)
    assert np.allclose(cov, cov.T)
    assert np.linalg.eigvalsh(cov).min() > -1e-12
    assert np.allclose(np.sqrt(np.diag(cov)), sds)
