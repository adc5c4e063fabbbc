"""The structured search's stop rule: it stops itself once no rival is likely to beat the pick by
more than the band, says so with the number, and does not stop while the landscape still rises."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from rayspec._config import load_config
from rayspec._types import Candidate
from rayspec._types import SpecSettings
from rayspec._types import TrialState
from rayspec.search import Observation
from rayspec.search import SearchSpace
from rayspec.search import StructuredSearch
from rayspec.search import pick
from rayspec.search import weigh
from tests.helpers import TWIN_EXPERIMENT

pytestmark = pytest.mark.slow  # many simulated studies: out of the fast lane

BUDGET = 40


def _drive(level: Callable[[Candidate], float], seed: int, start_noise: float = 0.01
           ) -> tuple[StructuredSearch, list[Observation]]:  # fmt: skip
    """Run the search against ``level`` (true tok/s) with between-start and run noise until it
    stops itself or spends the budget."""
    space = SearchSpace.from_config(load_config(TWIN_EXPERIMENT).search)
    search = StructuredSearch(space, None, token_bytes=1)
    rng = random.Random(seed)
    observations: list[Observation] = [
        Observation(0, Candidate(), TrialState.COMPLETE,
                    tuple(level(Candidate()) * (1 + rng.gauss(0, 0.01)) for _ in range(5)),
                    role="baseline"),
    ]  # fmt: skip
    while len(observations) < BUDGET:
        proposal = search.propose(observations)
        if proposal is None:
            break
        offset = 1 + rng.gauss(0, start_noise)
        true = level(proposal.candidate)
        runs = tuple(true * offset * (1 + rng.gauss(0, 0.01)) for _ in range(5))
        observations.append(
            Observation(len(observations), proposal.candidate, TrialState.COMPLETE, runs)
        )
    return search, observations


def _flat(candidate: Candidate) -> float:
    return 100.0


def _rising(candidate: Candidate) -> float:
    """Deeper drafts pay: 6 % a step, to the space's deepest (6 steps)."""
    spec = candidate.spec
    return 80.0 if spec is None else 80.0 * 1.06**spec.num_steps


def test_a_flat_landscape_stops_with_its_number() -> None:
    for seed in range(3):
        search, observations = _drive(_flat, seed)
        assert len(observations) < BUDGET, f"seed {seed} never stopped"
        reason = search.stop_reason(observations)
        # The rule is stated with the number it stopped on, below the threshold: the likeliest
        # rival's chance, or the most another restart is expected to gain the pick.
        if reason.startswith("converged: P("):
            prob = float(reason.split(") = ")[1].split(" %")[0])
            assert prob < 100 * search.stop_below
        else:
            assert reason.startswith("converged: another restart is expected to gain the pick ")
            gain = float(reason.split("gain the pick ")[1].split(" %")[0])
            assert gain < 100 * search.gain_below


def test_a_rising_landscape_does_not_stop_before_its_top() -> None:
    for seed in range(2):
        search, observations = _drive(_rising, seed)
        deepest = max(o.candidate.spec.num_steps for o in observations if o.candidate.spec)
        assert deepest == 6  # it climbed to the space's edge before it stopped
        choice = pick(weigh(observations).points)
        assert choice is not None and choice.point.candidate.spec is not None
        assert choice.point.candidate.spec.num_steps == 6


def test_a_rival_likely_to_beat_the_pick_by_the_band_keeps_the_search_going() -> None:
    """A stopped search, then one rival's start 4 % luckier: another restart could move the
    pick, so the search goes on."""
    space = SearchSpace.from_config(load_config(TWIN_EXPERIMENT).search)
    search = StructuredSearch(space, None, token_bytes=1)
    _, observations = _drive(_flat, 1)
    assert search.propose(observations) is None
    top = max((o for o in observations if o.candidate.spec), key=lambda o: sum(o.runs))
    rival = next(o for o in observations if o.candidate.spec and o.key != top.key
                 and sum(1 for p in observations if p.key == o.key) == 1)  # fmt: skip
    lucky = Observation(len(observations), rival.candidate, TrialState.COMPLETE,
                        tuple(v * 1.04 for v in rival.runs))  # fmt: skip
    again = [o for o in observations if o.trial != rival.trial] + [lucky]
    proposal = search.propose(again)
    assert proposal is not None


def _starts(first: int, cand: Candidate, level: float, offsets: list[float], role: str = ""
            ) -> list[Observation]:  # fmt: skip
    """One start per offset (relative), 10 quiet runs each (0.2 % apart)."""
    return [
        Observation(first + i, cand, TrialState.COMPLETE,
                    tuple(level * (1 + off) * (1 + 0.002 * (j % 3 - 1)) for j in range(10)),
                    role=role)
        for i, off in enumerate(offsets)
    ]  # fmt: skip


def test_a_floor_duel_gets_more_starts_where_the_start_noise_is_three_times_the_prior() -> None:
    """A tree 3 % above the enqueued floor, four starts each, starts 3 % apart: the floor's
    97.5 % is out of reach, and before the duel stopped at four starts a side, which left the
    pick on the floor for the rest of the budget (field3x/quick, 3 seeds of 20). Now each side
    may be started until the measured noise could settle it; at the prior's 1 % the cap is
    still four."""
    space = SearchSpace.from_config(load_config(TWIN_EXPERIMENT).search)
    search = StructuredSearch(space, None, token_bytes=1)
    env = (("NCCL_PROTO", "LL"),)
    floor = Candidate(nccl_env=env, spec=SpecSettings("EAGLE3", 2, 1, 3))
    tree = Candidate(nccl_env=env, spec=SpecSettings("EAGLE3", 2, 4, 6))
    swing = [0.03, -0.03, 0.03, -0.03]
    obs = [
        *_starts(0, Candidate(), 63.0, [0.0], role="baseline"),
        *_starts(1, floor, 95.0, swing, role="enqueued[0]"),
        *_starts(5, tree, 98.0, swing),
    ]
    view = search._view(obs, ())
    assert view.noise.between > 0.02
    choice = pick(view.points)
    assert choice is not None and choice.point.candidate == floor
    assert choice.best.candidate == tree
    proposal = search._improve(view)
    assert proposal is not None and proposal.reason.startswith("settle the best")
    assert search.duel_starts(view.noise) > 4
    quiet = weigh(_starts(0, tree, 98.0, [0.005, -0.005, 0.004, -0.004])).noise
    assert search.duel_starts(quiet) == search.max_starts + 1


def test_a_rival_worth_too_little_a_restart_stops_the_search_with_its_gain() -> None:
    """The stop rule's second half: however likely a rival is to beat the pick by the band
    (``stop_below`` 0: every rival counts), once no restart is expected to gain the pick
    ``gain_below`` the search stops and says the expected gain it stopped on."""
    space = SearchSpace.from_config(load_config(TWIN_EXPERIMENT).search)
    _, observations = _drive(_flat, 1)
    keen = StructuredSearch(space, None, token_bytes=1, stop_below=0.0, gain_below=0.0)
    assert keen.propose(observations) is not None
    content = StructuredSearch(space, None, token_bytes=1, stop_below=0.0, gain_below=0.5)
    assert content.propose(observations) is None
    reason = content.stop_reason(observations)
    assert reason.startswith("converged: another restart is expected to gain the pick ")
    gain = float(reason.split("gain the pick ")[1].split(" %")[0])
    assert 0 <= gain < 50.0 and "though P(the likeliest" in reason


def test_a_start_noise_read_from_one_pair_of_starts_does_not_stop_the_search() -> None:
    """The floor started twice 0.2 % apart, a tree once 3 % below it: one pair of starts (one
    degree of freedom) reads the node as quiet, and on the field profile at 3x its start noise
    the search stopped on the floor so (field3x/full, seed 22, 7 restarts). Before it stops,
    the likeliest rival measured once is started again; with two pairs, not."""
    space = SearchSpace.from_config(load_config(TWIN_EXPERIMENT).search)
    search = StructuredSearch(space, None, token_bytes=1)
    env = (("NCCL_PROTO", "LL"),)
    floor = Candidate(nccl_env=env, spec=SpecSettings("EAGLE3", 2, 1, 3))
    tree = Candidate(nccl_env=env, spec=SpecSettings("EAGLE3", 2, 4, 6))
    obs = [
        *_starts(0, Candidate(), 63.0, [0.0], role="baseline"),
        *_starts(1, floor, 97.7, [0.001, -0.001], role="enqueued[0]"),
        *_starts(3, tree, 94.8, [0.0]),
    ]
    view = search._view(obs, ())
    choice = pick(view.points)
    assert choice is not None and choice.point.candidate == floor
    proposal = search._second_pair(view, search._rivals(view, choice.point))
    assert proposal is not None and proposal.candidate == tree and proposal.repeat_of == 3
    assert proposal.reason.startswith("measure the start noise on a second configuration")
    twice = search._view([*obs, *_starts(4, tree, 94.8, [0.03])], ())
    choice = pick(twice.points)
    assert choice is not None
    assert search._second_pair(twice, search._rivals(twice, choice.point)) is None


def test_one_start_is_judged_at_three_times_the_prior_until_a_configuration_is_started_twice(
) -> None:  # fmt: skip
    """What pruning judges a first start with: before any repeat the start noise is the
    prior's, which may be a third of the node's (as the pick's floor guard assumes)."""
    env = (("NCCL_PROTO", "LL"),)
    floor = Candidate(nccl_env=env, spec=SpecSettings("EAGLE3", 2, 1, 3))
    tree = Candidate(nccl_env=env, spec=SpecSettings("EAGLE3", 2, 4, 6))
    once = weigh([*_starts(0, floor, 95.0, [0.0]), *_starts(1, tree, 98.0, [0.0])])
    assert once.one_start_between() == 3 * once.noise.between
    twice = weigh([*_starts(0, floor, 95.0, [0.0]), *_starts(1, tree, 98.0, [0.0, 0.02])])
    assert twice.one_start_between() == twice.noise.between
