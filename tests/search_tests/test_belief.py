"""The belief search's pieces: the value of starts (KG(*) of the constrained decision), the one
belief (it widens when the model is wrong), and the one decision.

The nodes here are generated, not the twin's: a chain's acceptance per depth and a cycle cost
that is either of the online model's form (linear in verify width and draft steps) or steps at
graph sizes the way a real node's verify does.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import numpy as np
import pytest

from rayspec._types import Candidate
from rayspec._types import SpecSettings
from rayspec._types import TrialState
from rayspec.search import believe
from rayspec.search import decide
from rayspec.search._history import Observation
from rayspec.search._kg import deployed_value
from rayspec.search._kg import kg_star
from rayspec.search._online import Acceptance

RATES = (0.75, 0.6, 0.5, 0.4, 0.35, 0.3)


def _monte_carlo_value(
    means: np.ndarray, cov: np.ndarray, x: int, noise: float, floor: int | None, risk: float
) -> float:
    """The deployed mean after one measurement of ``x``, simulated: the measurement's draw
    moves the means, the covariance shrinks, and the decision takes the best mean whose
    P(below the floor) <= risk (2 million draws: a standard error near 2e-5)."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf(1 - risk)
    s = cov[:, x] / math.sqrt(cov[x, x] + noise)
    shrunk = cov - np.outer(s, s)
    draws = np.random.default_rng(5).standard_normal(2_000_000)
    post = means[:, None] + s[:, None] * draws[None, :]
    ok = np.ones_like(post, dtype=bool)
    if floor is not None:
        var = np.diag(shrunk) + shrunk[floor, floor] - 2 * shrunk[:, floor]
        ok = (post - post[floor]) >= z * np.sqrt(np.clip(var, 0, None))[:, None]
        ok[floor] = True
    return float(np.where(ok, post, -np.inf).max(axis=0).mean())


@pytest.mark.parametrize("floor", [None, 0])
def test_the_deployed_value_is_what_deciding_after_the_measurement_gives(floor) -> None:
    rng = np.random.default_rng(0)
    a = rng.normal(size=(5, 5)) * 0.02
    cov = a @ a.T + np.eye(5) * 1e-4
    means = np.array([0.0, 0.03, 0.01, -0.02, 0.02])
    for x in range(1, 5):
        exact = deployed_value(
            means, cov, x, 4e-4, floor=floor, risk=0.025, eligible_after=np.ones(5, dtype=bool)
        )
        # the grid's error: the decision jumps where a rival becomes eligible
        assert exact == pytest.approx(_monte_carlo_value(means, cov, x, 4e-4, floor, 0.025),
                                      abs=3e-4)  # fmt: skip


def test_a_start_that_can_free_a_held_back_configuration_is_worth_it() -> None:
    """Measured once, 4 % above the floor but too unsure to replace it: starting it again is
    valued by the deployment it may allow; a configuration as good as the floor is not."""
    means = np.array([0.0, 0.04, 0.0])
    cov = np.diag([0.02**2, 0.03**2, 0.03**2])
    now = 0.0  # the floor is deployed: the rival's P(below the floor) is 13 %
    free, _ = kg_star(means, cov, 1, 0.03**2, now=now, floor=0, risk=0.025,
                      eligible_after=np.ones(3, dtype=bool))  # fmt: skip
    tied, _ = kg_star(means, cov, 2, 0.03**2, now=now, floor=0, risk=0.025,
                      eligible_after=np.ones(3, dtype=bool))  # fmt: skip
    assert free > 0.005 > tied


_ACCEPT = Acceptance(RATES, (1000,) * len(RATES), 0.8)
_THETA = 0.34


def _truth(spec: SpecSettings, cost: Callable[[SpecSettings], float]) -> float:
    """tok/s of a generated node: the online model's acceptance and tree shape, over ``cost``
    (of the model's form, or not)."""
    return 1000.0 * _ACCEPT.tree_length(spec, _THETA) / cost(spec)


def _linear(spec: SpecSettings) -> float:
    return 18.0 + 0.5 * (spec.num_draft_tokens - 1) + 0.4 * spec.num_steps


def _graph_steps(spec: SpecSettings) -> float:
    """A verify of N tokens padded up to the next captured batch size."""
    captured = (1, 2, 4, 8, 16)
    padded = next(c for c in captured if c >= spec.num_draft_tokens)
    return 18.0 + 0.8 * padded + 0.4 * spec.num_steps


def _histogram(steps: int, rng: random.Random, n: int = 400) -> tuple[int, ...]:
    hist = [0] * (steps + 1)
    for _ in range(n):
        i = 0
        while i < steps and rng.random() < RATES[i]:
            i += 1
        hist[i] += 1
    return tuple(hist)


def _observe(cost: Callable[[SpecSettings], float], seed: int) -> list[Observation]:
    rng = random.Random(seed)
    specs = [SpecSettings("EAGLE3", k, 1, k + 1) for k in (1, 2, 3, 4)]
    specs += [SpecSettings("EAGLE3", k, 4, n) for k in (2, 3) for n in (3, 5, 7, 9, 12)]
    out = []
    for t, spec in enumerate(specs):
        level = _truth(spec, cost) * math.exp(rng.gauss(0, 0.01))
        runs = tuple(level * math.exp(rng.gauss(0, 0.01)) for _ in range(5))
        out.append(Observation(t, Candidate(spec=spec), TrialState.COMPLETE, runs,
                               accept_histogram=_histogram(spec.num_steps, rng)))  # fmt: skip
    return out


def test_the_belief_widens_when_the_model_is_wrong() -> None:
    """The discrepancy is fitted, not set: on a node whose verify cost steps at graph sizes
    (outside the online model's linear cost) the belief believes the model less."""
    linear = [believe(_observe(_linear, s)).discrepancy for s in range(4)]
    steps = [believe(_observe(_graph_steps, s)).discrepancy for s in range(4)]
    assert min(steps) > 2 * max(linear)


def test_an_accept_length_of_one_cannot_replace_a_floor_on_wild_starts() -> None:
    """The real-SGLang case: the baseline's two starts read 12.2 and 60.1 tok/s, a setting
    whose drafts are all rejected read 60 on one start. Deploying it would claim +60 %; the
    belief, judging at the start noise the two baseline starts show, keeps the baseline."""
    base = Candidate()
    spec = Candidate(spec=SpecSettings("EAGLE3", 3, 1, 4))
    obs = [
        Observation(0, base, TrialState.COMPLETE, (12.1, 12.3, 12.2), role="baseline"),
        Observation(1, base, TrialState.COMPLETE, (60.0, 60.2, 60.1), role="baseline"),
        Observation(
            2,
            spec,
            TrialState.COMPLETE,
            (59.8, 60.3, 60.0),
            accept_length=1.03,
            accept_histogram=(97, 3),
        ),  # fmt: skip
    ]
    belief = believe(obs)
    keys = {c.label(): k for k, c in zip(belief.keys, belief.candidates, strict=True)}
    floor = keys[base.label()]
    decision = decide(belief, list(belief.keys), [floor])
    assert decision is not None and decision.key == floor
