"""A configuration started once leaves a floor only on a lead its single start offset cannot
explain, with the start noise as uncertain as one pair of starts leaves it.

The studies here are generated, not listed: every start scales its runs by its own offset (2 %,
twice the prior's), every run draws 5 %. The floor (a hand-tuned setting on its own NCCL set) is
started once; a rival truly 3 % below it is started twice, so the start noise counts as
measured, from one pair; a rival truly 1 % below the floor is started once, on 5 runs. One pair
of starts leaves the start noise's sd uncertain by a factor of about 2: at its median a 99.9 %
lead is 3.1 sd, which one lucky start and one unlucky floor reach in about 1 study of 150.
``prob_positive`` judges the lead with the noise's predictive variance instead.
"""

from __future__ import annotations

import math
import random

from hypothesis import given
from hypothesis import strategies as st

from rayspec import Candidate
from rayspec import SpecSettings
from rayspec._types import TrialState
from rayspec.search import Noise
from rayspec.search import Observation
from rayspec.search import pick
from rayspec.search import prob_positive
from rayspec.search import weigh

START_SD, RUN_SD = 0.02, 0.05
HAND_TUNED = (("NCCL_ALGO", "Ring"), ("NCCL_PROTO", "LL"))
SCREENED = (("NCCL_P2P_LEVEL", "SYS"), ("NCCL_PROTO", "LL"))
FLOOR = Candidate(nccl_env=HAND_TUNED, spec=SpecSettings("EAGLE3", 2, 1, 3))
TWICE = Candidate(nccl_env=SCREENED, spec=SpecSettings("EAGLE3", 2, 4, 7))
ONCE = Candidate(nccl_env=SCREENED, spec=SpecSettings("EAGLE3", 3, 1, 4))


def _start(trial: int, cand: Candidate, truth: float, runs: int, rng: random.Random,
           role: str = "") -> Observation:  # fmt: skip
    offset = rng.gauss(0.0, START_SD)
    values = tuple(100.0 * truth * math.exp(offset + rng.gauss(0.0, RUN_SD)) for _ in range(runs))
    return Observation(trial, cand, TrialState.COMPLETE, values, role=role)


def _study(rng: random.Random) -> list[Observation]:
    return [
        _start(0, FLOOR, 1.00, 15, rng, role="enqueued[0]"),
        _start(1, TWICE, 0.97, 15, rng),
        _start(2, TWICE, 0.97, 15, rng),
        _start(3, ONCE, 0.99, 5, rng),
    ]


def _picks_of_once(studies: int, *, with_noise: bool) -> int:
    rng = random.Random(1)
    count = 0
    for _ in range(studies):
        evidence = weigh(_study(rng))
        choice = pick(evidence.points, difference=evidence.difference,
                      noise=evidence.noise if with_noise else None)  # fmt: skip
        assert choice is not None
        count += choice.point.candidate == ONCE
    return count


def test_one_lucky_start_does_not_leave_the_floor_on_an_uncertain_start_noise() -> None:
    # The once-started rival is truly below the floor: a 99.9 % guard may take it in 2 of 2000
    # studies. Judged at the start noise's median it is taken in about 7 in 1000 (13 here);
    # with the noise's predictive variance, at the promised rate (2 here).
    assert _picks_of_once(2000, with_noise=False) >= 8
    assert _picks_of_once(2000, with_noise=True) <= 4


def test_a_clear_lead_on_one_start_still_leaves_the_floor() -> None:
    # The guard is not a ban: a rival 30 % ahead on one start is picked in (nearly) every
    # study. (Averaging the normal over the noise's whole posterior instead, whose tail from one
    # pair of starts reaches 10 % start noise, took it in 38 of 50.)
    rng = random.Random(2)
    picked = 0
    for _ in range(50):
        obs = _study(rng)
        obs[3] = _start(3, ONCE, 1.30, 5, rng)
        evidence = weigh(obs)
        choice = pick(evidence.points, difference=evidence.difference, noise=evidence.noise)
        assert choice is not None
        picked += choice.point.candidate == ONCE
    assert picked >= 48


NOISE = Noise(0.05, 0.02, 1.4, tuple((s, p) for s, p in [(0.01, 0.25), (0.02, 0.5), (0.04, 0.25)]))


@given(
    st.floats(-0.3, 0.3, allow_nan=False),
    st.floats(0.001, 0.1, allow_nan=False),
    st.floats(0.0, 3.0, allow_nan=False),
)
def test_prob_positive_is_a_probability_of_the_sign(
    diff: float, sd: float, offsets: float
) -> None:
    p, q = prob_positive(diff, sd, NOISE, offsets), prob_positive(-diff, sd, NOISE, offsets)
    assert 0.0 <= p <= 1.0
    assert math.isclose(p + q, 1.0, abs_tol=1e-9)  # the sign of the difference, nothing else
    assert prob_positive(diff + 0.01, sd, NOISE, offsets) >= p - 1e-12  # a larger lead: surer
    normal = 0.5 * math.erfc(-diff / (sd * math.sqrt(2.0)))
    assert math.isclose(prob_positive(diff, sd, NOISE, 0.0), normal, abs_tol=1e-9)
    assert math.isclose(prob_positive(diff, sd, Noise(0.05, 0.02, 1.4), offsets), normal,
                        abs_tol=1e-9)  # fmt: skip
