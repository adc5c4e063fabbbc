"""The strategy seam's answers: a trial asked of the study, or a Wait that says whether the
search is over (no Optuna study needed: the study is a stand-in that records the asks)."""

from __future__ import annotations

from rayspec._types import Candidate
from rayspec.search import SamplerStrategy
from rayspec.search import SearchSpace
from rayspec.search import StructuredSearch
from rayspec.search import Wait
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import cached_config


class _Study:
    """Answers ``ask`` with what it was asked; grid state as set."""

    def __init__(self, *, exhausted: bool = False, grid_waits: bool = False) -> None:
        self._exhausted, self._grid_waits = exhausted, grid_waits
        self.asks: list[tuple] = []

    def exhausted(self) -> bool:
        return self._exhausted

    def grid_waits(self) -> bool:
        return self._grid_waits

    def ask(self, candidate=None, *, reason: str = "", repeat_of=None):
        self.asks.append((candidate, reason, repeat_of))
        return "trial"


def _search(**kwargs) -> StructuredSearch:
    space = SearchSpace.from_config(cached_config(TWIN_EXPERIMENT).search)
    return StructuredSearch(space, None, token_bytes=1, **kwargs)


def test_the_sampler_strategy_asks_optuna_until_the_grid_is_walked() -> None:
    strategy = SamplerStrategy()
    study = _Study()
    assert strategy.ask(study, [], []) == "trial" and study.asks == [(None, "", None)]
    assert strategy.ask(_Study(grid_waits=True), [], []) == Wait()
    done = strategy.ask(_Study(exhausted=True), [], [])
    assert done == Wait(done="every configuration of the grid was tried")
    assert strategy.equivalent((("NCCL_PROTO", "LL"),)) == (("NCCL_PROTO", "LL"),)
    assert not strategy.measured_in_full(Candidate())


def test_the_structured_search_queues_its_proposal_with_its_reason() -> None:
    search = _search()
    study = _Study()
    proposal = search.propose([], [])
    assert proposal is not None
    assert search.ask(study, [], []) == "trial"
    assert study.asks == [(proposal.candidate, proposal.reason, proposal.repeat_of)]


def test_the_structured_search_is_done_only_once_nothing_runs() -> None:
    class _Answered(StructuredSearch):
        def propose(self, observations, pending=()):
            return None

    search = _Answered(SearchSpace.from_config(cached_config(TWIN_EXPERIMENT).search), None,
                       token_bytes=1)  # fmt: skip
    assert search.ask(_Study(), [], [Candidate()]) == Wait()  # a running trial may change it
    assert search.ask(_Study(), [], []).done.startswith("converged")


def test_no_speculation_is_measured_in_full_with_several_loads() -> None:
    several = _search(loads=2)
    off = several.space.baseline()  # no speculation
    assert off.spec is None and several.measured_in_full(off)
    assert not _search().measured_in_full(off)  # one load: pruned like any other
    chain = several.propose([], [])
    assert chain is not None and chain.candidate.spec is not None
    assert not several.measured_in_full(chain.candidate)
