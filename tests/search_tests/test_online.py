"""The online model: acceptance and cost fitted from what each start reports, and the
structured search's stage that launches where it predicts the best."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from rayspec._types import Candidate
from rayspec._types import SpecSettings
from rayspec._types import TrialState
from rayspec.search import SearchSpace
from rayspec.search import StructuredSearch
from rayspec.search._history import Observation
from rayspec.search._history import pick
from rayspec.search._online import _SLOPE_PRIOR
from rayspec.search._online import Measured
from rayspec.search._online import fit_acceptance
from rayspec.search._online import fit_costs
from rayspec.search._online import fit_model
from rayspec.search._online import mean_accept_length
from rayspec.twin import PerfModel
from rayspec.twin import load_profile
from rayspec.twin import resolve_nccl
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import cached_config

TUNED = (("NCCL_P2P_LEVEL", "PHB"),)


def _expected_histogram(rates: list[float], steps: int = 200_000) -> tuple[int, ...]:
    """Verify steps by drafts accepted for a chain with these conditional rates (rounded)."""
    hist, prefix = [], 1.0
    for a in rates:
        hist.append(round(steps * prefix * (1 - a)))
        prefix *= a
    hist.append(round(steps * prefix))
    return tuple(hist)


def _sampled_histogram(rates: list[float], steps: int, rng: random.Random) -> tuple[int, ...]:
    hist = [0] * (len(rates) + 1)
    for _ in range(steps):
        i = 0
        while i < len(rates) and rng.random() < rates[i]:
            i += 1
        hist[i] += 1
    return tuple(hist)


def test_the_acceptance_fit_recovers_the_per_depth_rates() -> None:
    rates = [0.8, 0.6, 0.45, 0.3]
    fit = fit_acceptance([(4, _expected_histogram(rates))])
    assert fit is not None
    assert fit.rates == pytest.approx(rates, abs=1e-4)
    # Sampled, and pooled over two chains of different depths (the 2-step chain informs the
    # first two depths only): within 3 standard errors.
    rng = random.Random(7)
    fit = fit_acceptance([(2, _sampled_histogram(rates[:2], 4000, rng)),
                          (4, _sampled_histogram(rates, 4000, rng))])  # fmt: skip
    assert fit is not None and len(fit.rates) == 4
    for a, got, n in zip(rates, fit.rates, fit.reached, strict=True):
        assert abs(got - a) < 3 * math.sqrt(a * (1 - a) / n)
    assert fit.reached[0] == 8000  # every verify step of both chains reached depth 1


def test_the_acceptance_extrapolates_the_twins_geometric_decay() -> None:
    a1, rho = 0.82, 0.9
    rates = [a1 * rho**d for d in range(3)]
    fit = fit_acceptance([(3, _expected_histogram(rates))])
    assert fit is not None
    assert fit.decay == pytest.approx(rho, abs=1e-3)
    assert fit.rate(6) == pytest.approx(a1 * rho**5, rel=1e-3)
    assert fit.chain_length(2) == pytest.approx(1 + rates[0] + rates[0] * rates[1], rel=1e-3)
    # A depth that too few verify steps reached is not a rate.
    assert fit_acceptance([(2, (3, 2, 1))]) is None


def _measured(spec: SpecSettings, cycle_ms: float, hist: tuple[int, ...]) -> Measured:
    return Measured(spec, 1000.0 * mean_accept_length(hist) / cycle_ms, hist)


def test_the_cost_fit_recovers_the_cycle_costs() -> None:
    c0, gamma, beta = 17.5, 0.6, 0.45

    def cycle(s: SpecSettings) -> float:
        return c0 + gamma * (s.num_draft_tokens - 1) + beta * s.num_steps

    hist = _expected_histogram([0.7, 0.5, 0.3])
    chains = [SpecSettings("EAGLE3", k, 1, k + 1) for k in (2, 3)]
    costs = fit_costs([_measured(s, cycle(s), hist) for s in chains])
    assert costs is not None and not costs.split
    assert (costs.c0, costs.beta) == pytest.approx((c0, gamma + beta))
    # One depth: the level from the chain, the slope from the prior (chains only).
    one = fit_costs([_measured(chains[0], cycle(chains[0]), hist)])
    assert one is not None and one.prior and not one.split
    assert one.cycle_ms(chains[0]) == pytest.approx(cycle(chains[0]))
    assert one.cycle_ms(chains[1]) == pytest.approx(cycle(chains[0]) * (1 + _SLOPE_PRIOR))
    tree = SpecSettings("EAGLE3", 3, 4, 8)
    costs = fit_costs([_measured(s, cycle(s), hist) for s in (*chains, tree)])
    assert costs is not None and costs.split
    assert (costs.c0, costs.gamma, costs.beta) == pytest.approx((c0, gamma, beta))
    # A nearly free verify width whose noise says "negative": it is fitted as free, never as
    # wider trees costing less.
    shown = [_measured(s, c0 + beta * s.num_steps, hist) for s in chains]
    shown.append(_measured(tree, c0 + beta * tree.num_steps - 0.2, hist))
    costs = fit_costs(shown)
    assert costs is not None and costs.gamma == 0.0 and costs.beta > 0


@pytest.mark.parametrize("name", ["kimi-k2.5-tp8-pcie", "l40s-pcie-tp4-dense-deep"])
def test_two_chains_and_one_tree_of_the_twin_predict_its_other_settings(name: str) -> None:
    """Fitted to the twin's own expected values, the model predicts the settings it never saw
    within a few per cent (the twin's MoE verify is not exactly linear in its width)."""
    profile = load_profile(name)
    nccl = resolve_nccl(dict(TUNED), profile)

    def seen(spec: SpecSettings) -> Measured:
        model = PerfModel(profile, nccl, spec)
        rates = model.acceptance()
        hist = _expected_histogram(rates) if spec.eagle_topk == 1 else _tree_histogram(model)
        return Measured(spec, model.expected_tok_s(), hist)

    shown = [SpecSettings("EAGLE3", 2, 1, 3), SpecSettings("EAGLE3", 3, 1, 4),
             SpecSettings("EAGLE3", 3, 4, 7)]  # fmt: skip
    fit = fit_model([seen(s) for s in shown])
    assert fit is not None
    for spec in (SpecSettings("EAGLE3", k, 1, k + 1) for k in (1, 4, 6, 8)):
        truth = PerfModel(profile, nccl, spec).expected_tok_s()
        assert fit.predict(spec) == pytest.approx(truth, rel=0.04), spec
    for spec in (SpecSettings("EAGLE3", 2, 4, 6), SpecSettings("EAGLE3", 5, 4, 12)):
        truth = PerfModel(profile, nccl, spec).expected_tok_s()
        assert fit.predict(spec) == pytest.approx(truth, rel=0.06), spec


def _tree_histogram(model: PerfModel, cycles: int = 40_000) -> tuple[int, ...]:
    rng = random.Random(3)
    assert model.spec is not None
    hist = [0] * model.spec.num_draft_tokens
    for _ in range(cycles):
        hist[model.sample_cycle_tokens(rng) - 1] += 1
    return tuple(hist)


def _search() -> StructuredSearch:
    space = SearchSpace.from_config(cached_config(TWIN_EXPERIMENT).search)
    return StructuredSearch(space, None, token_bytes=1)


def _starts(trial: int, spec: SpecSettings | None, tok_s: float, hist, **kw) -> list[Observation]:
    """Two starts of a configuration (so no floor asks for its second start first)."""
    cand = Candidate(nccl_env=TUNED if spec is not None else (), spec=spec)
    return [
        Observation(
            trial + i,
            cand,
            TrialState.COMPLETE,
            runs=(tok_s * f,) * 5,
            accept_histogram=hist,
            **kw,
        )  # fmt: skip
        for i, f in enumerate((0.995, 1.005))
    ]


def test_the_stage_launches_the_models_best_chain_after_two_chains() -> None:
    profile = load_profile("l40s-pcie-tp4-dense-deep")
    nccl = resolve_nccl(dict(TUNED), profile)
    obs = _starts(0, None, 45.0, None, role="baseline")
    for k in (2, 3):
        model = PerfModel(profile, nccl, SpecSettings("EAGLE3", k, 1, k + 1))
        obs += _starts(10 * k, model.spec, model.expected_tok_s(),
                       _expected_histogram(model.acceptance(), 5000))  # fmt: skip
    search = _search()
    proposal = search.propose(obs)
    assert proposal is not None and proposal.reason.startswith("the online model's best")
    fit = search.online_model(search._view(obs, ()))
    assert fit is not None
    best = max(search._model_space(), key=lambda s: fit.predict(s) or 0.0)
    assert proposal.candidate.spec == best
    assert best.num_steps == 6  # the deep drafter's optimum in this space, in one restart
    # Once it is measured (at what the model said), the model has nothing left to propose.
    measured = PerfModel(profile, nccl, best)
    obs += _starts(60, best, measured.expected_tok_s(),
                   _expected_histogram(measured.acceptance(), 5000))  # fmt: skip
    after = search.propose(obs)
    assert after is None or not after.reason.startswith("the online model's best")


def test_a_chain_that_barely_beats_no_speculation_measures_it_with_the_screened_set() -> None:
    # A chain 1.2x the baseline (NCCL's defaults): the screened set may well make no
    # speculation the faster one.
    obs = _starts(0, None, 70.0, None, role="baseline")
    obs += _starts(10, SpecSettings("EAGLE3", 2, 1, 3), 84.0, (300, 200, 100))
    proposal = _search().propose(obs)
    assert proposal is not None and proposal.candidate.spec is None
    assert proposal.candidate.nccl_env == TUNED  # the best measured set (no screen here)
    assert proposal.reason.startswith("no speculation with the screened NCCL set: the first")
    # A chain far ahead does not ask for it first.
    far = _starts(0, None, 63.1, None, role="baseline")
    far += _starts(10, SpecSettings("EAGLE3", 2, 1, 3), 82.9, (300, 200, 100))  # weak drafter
    proposal = _search().propose(far)
    assert proposal is not None and proposal.candidate.spec is not None


def test_two_chains_predict_a_tree() -> None:
    """Before any tree splits the cost slope, a tree is costed with the slope split evenly
    between its width and its depth: a prediction (no longer None) within 5 % here."""
    profile = load_profile("kimi-k2.5-tp8-pcie")
    nccl = resolve_nccl(dict(TUNED), profile)
    chains = []
    for k in (2, 3):
        model = PerfModel(profile, nccl, SpecSettings("EAGLE3", k, 1, k + 1))
        assert model.spec is not None
        chains.append(Measured(model.spec, model.expected_tok_s(),
                               _expected_histogram(model.acceptance())))  # fmt: skip
    fit = fit_model(chains)
    assert fit is not None and not fit.costs.split
    for spec in (SpecSettings("EAGLE3", 2, 4, 6), SpecSettings("EAGLE3", 3, 2, 5)):
        predicted = fit.predict(spec)
        truth = PerfModel(profile, nccl, spec).expected_tok_s()
        assert predicted == pytest.approx(truth, rel=0.05), spec


def _field_chain(trial: int, k: int, profile_name: str = "kimi-k2.5-tp8-pcie", scale: float = 1.0
                 ) -> list[Observation]:  # fmt: skip
    profile = load_profile(profile_name)
    chain = SpecSettings("EAGLE3", k, 1, k + 1)
    model = PerfModel(profile, resolve_nccl(dict(TUNED), profile), chain)
    assert model.spec is not None
    return _starts(trial, model.spec, scale * model.expected_tok_s(),
                   _expected_histogram(model.acceptance(), 5000))  # fmt: skip


def test_after_two_chains_the_models_tree_goes_before_settling_the_chains() -> None:
    """Field node: the 3-step chain measured a hair above the enqueued 2-step one (a floor, one
    start). The old search spent a restart confirming the 3-step chain before it could replace
    the floor; now the online model's tree (predicted well above both) is launched first."""
    obs = _starts(0, None, 61.0, None, role="baseline")
    enq = _field_chain(10, 2)[0]
    obs.append(Observation(10, enq.candidate, TrialState.COMPLETE, runs=enq.runs,
                           accept_histogram=enq.accept_histogram, role="enqueued[0]"))  # fmt: skip
    obs += _field_chain(20, 3, scale=1.03)[:1]
    search = _search()
    proposal = search.propose(obs)
    assert proposal is not None
    assert proposal.reason.startswith("the online model's best"), proposal.reason
    spec = proposal.candidate.spec
    assert spec is not None and spec.eagle_topk > 1  # a tree, before any tree was measured


def _field_tree(trial: int, spec: SpecSettings) -> list[Observation]:
    profile = load_profile("kimi-k2.5-tp8-pcie")
    model = PerfModel(profile, resolve_nccl(dict(TUNED), profile), spec)
    return _starts(trial, spec, model.expected_tok_s(), _tree_histogram(model))


def test_a_ladder_rung_the_split_model_rules_out_is_not_launched() -> None:
    """Field node, after two chains (the 3-step one measured 2 % lucky, so the chain ladder
    would climb on) and the best tree: the ladder's next rung (4 steps) is predicted ~8 % below
    the tree, so no restart goes to it."""
    obs = _starts(0, None, 61.0, None, role="baseline")
    obs += _field_chain(10, 2) + _field_chain(20, 3, scale=1.02)
    obs += _field_tree(30, SpecSettings("EAGLE3", 2, 4, 6))
    search = _search()
    fit = search.online_model(search._view(obs, ()))
    assert fit is not None and fit.costs.split
    chain4 = fit.predict(SpecSettings("EAGLE3", 4, 1, 5))
    assert chain4 is not None and chain4 < 0.95 * max(o.runs[0] for o in obs)
    seen = list(obs)
    for _ in range(6):  # whatever it measures next, it never climbs the chains again
        proposal = search.propose(seen)
        if proposal is None:
            break
        spec = proposal.candidate.spec
        assert spec is None or spec.eagle_topk > 1 or spec.num_steps <= 3, proposal.reason
        seen += _field_tree(100 + 10 * len(seen), spec)[:1] if spec and spec.eagle_topk > 1 else [
            Observation(100 + 10 * len(seen), proposal.candidate, TrialState.COMPLETE,
                        runs=(60.0,) * 5)]  # fmt: skip


def test_one_chain_proposes_the_models_deep_setting_at_once() -> None:
    """The dense NVLink node after the baseline and ONE chain (2 steps): the chain's
    acceptance at each depth and the prior slope, split evenly between verify width and draft
    steps, put a deep setting well above it, launched next (the old search climbed the chain
    ladder one rung at a time: 3 steps). It is a tree: one chain predicts trees too."""
    obs = _starts(0, None, 180.0, None, role="baseline")
    obs += _field_chain(10, 2, "h200-nvlink-tp8-dense")
    proposal = _search().propose(obs)
    assert proposal is not None
    assert proposal.reason.startswith("the online model's best"), proposal.reason
    spec = proposal.candidate.spec
    assert spec is not None and spec.num_steps >= 5 and spec.eagle_topk > 1


def test_one_chain_and_one_tree_fit_the_even_split_not_one_slope() -> None:
    """A chain at one depth and a tree are two designs for three cost terms: either slope alone
    fits them exactly, so the model keeps the even split (its slope fitted to both) and does
    not claim to have parted verify width from draft steps."""
    chain = SpecSettings("EAGLE3", 2, 1, 3)
    tree = SpecSettings("EAGLE3", 2, 4, 8)
    hist = (10, 20, 30)  # verify steps that accepted 0, 1, 2 drafts
    rate = 1000.0 * mean_accept_length(hist)  # tok/s x cycle ms
    measured = [Measured(chain, rate / 30.0, hist), Measured(tree, rate / 34.0, hist)]
    costs = fit_costs(measured)
    assert costs is not None and not costs.split and not costs.prior
    # c0 + s (w + k) / 2: chain (2 + 2) / 2 = 2, tree (7 + 2) / 2 = 4.5 -> s = 4 / 2.5
    assert costs.beta == pytest.approx(4.0 / 2.5)
    assert costs.cycle_ms(chain) == pytest.approx(30.0) and costs.cycle_ms(tree) == pytest.approx(
        34.0
    )


def test_a_rung_unlikely_to_beat_the_pick_by_the_band_is_not_launched() -> None:
    """Field node, noise-free, after two chains and its best tree: the tree ladder's rungs are
    rivals like any other. The 4-token rung (the model's prediction pooled with the surface:
    unlikely to beat the pick by more than the band) is skipped, and the search stops within
    three more restarts (the old one launched it, then settled it and explored: five)."""
    obs = _starts(0, None, 61.0, None, role="baseline")
    obs += _field_chain(10, 2) + _field_chain(20, 3)
    obs += _field_tree(30, SpecSettings("EAGLE3", 2, 4, 6))
    search = _search()
    launched: list[SpecSettings | None] = []
    while len(launched) < 10:
        proposal = search.propose(obs)
        if proposal is None:
            break
        spec = proposal.candidate.spec
        launched.append(spec)
        trial = 100 + 10 * len(launched)
        if spec is not None and spec.eagle_topk > 1:
            obs += _field_tree(trial, spec)[:1]
        else:  # no speculation or a chain: well below the tree
            obs.append(Observation(trial, proposal.candidate, TrialState.COMPLETE,
                                   runs=(60.0 if spec is None else 90.0,) * 5))  # fmt: skip
    assert SpecSettings("EAGLE3", 2, 4, 4) not in launched
    assert len(launched) <= 3, launched
    assert search.stop_reason(obs).startswith("converged: P(")


def test_a_setting_the_split_model_puts_above_a_lucky_pick_is_started_again() -> None:
    """Field node (runs with a 3 % spread, as the field protocol's), after two chains: the
    6-token topk-2 tree measured 1.5 % lucky on both its starts is the pick; the 8-token topk-4
    one, truly 1.8 % better, measured 1.5 % unlucky on its one start. On the measurements
    alone it is unlikely to beat the pick by the band and the search stopped on the lucky
    pick; the split model, whose level errs but whose ratio of two trees does not, puts it
    ahead, so it is started again before the search stops."""
    spread = (0.96, 1.02, 0.99, 1.04, 0.99)

    def noisy(o: Observation, scale: float) -> Observation:
        runs = tuple(scale * v * f for v, f in zip(o.runs, spread, strict=True))
        return Observation(o.trial, o.candidate, o.state, runs=runs,
                           accept_histogram=o.accept_histogram)  # fmt: skip

    obs = [noisy(o, 1.0) for o in _starts(0, None, 61.0, None, role="baseline")]
    obs += [noisy(o, 1.0) for o in _field_chain(10, 2) + _field_chain(20, 3)]
    lucky, unlucky = SpecSettings("EAGLE3", 2, 2, 6), SpecSettings("EAGLE3", 2, 4, 8)
    obs += [noisy(o, 1.015) for o in _field_tree(30, lucky)]
    obs += [noisy(o, 0.985) for o in _field_tree(40, unlucky)[:1]]
    off = Candidate(nccl_env=TUNED, spec=None)  # no speculation with the tuned set: below
    obs += [noisy(Observation(50 + i, off, TrialState.COMPLETE, runs=(70.0,) * 5), 1.0)
            for i in (0, 1)]  # fmt: skip
    search = _search()
    reasons: list[str] = []
    while len(reasons) < 10:
        proposal = search.propose(obs)
        if proposal is None:
            break
        reasons.append(proposal.reason)
        if proposal.repeat_of == 40:
            break
        trial = 100 + 10 * len(reasons)
        spec = proposal.candidate.spec
        if spec is not None and spec.eagle_topk > 1 and proposal.repeat_of is None:
            obs += [noisy(o, 1.0) for o in _field_tree(trial, spec)[:1]]  # at its truth
        else:  # a repeat keeps its luck; no speculation and a chain are well below the trees
            prior = next((o for o in obs if o.trial == proposal.repeat_of), None)
            runs = prior.runs if prior is not None else (70.0 if spec is None else 80.0,) * 5
            hist = prior.accept_histogram if prior is not None else None
            obs.append(Observation(trial, proposal.candidate, TrialState.COMPLETE, runs=runs,
                                   accept_histogram=hist))  # fmt: skip
    assert proposal is not None and proposal.repeat_of == 40, (reasons, search.stop_reason(obs))
    assert proposal.candidate.spec == unlucky


def test_a_floor_is_dueled_by_the_tree_the_split_model_puts_highest() -> None:
    """Field node, starts 3 % apart: the hand-tuned chain (its own NCCL set, a floor started
    three times) holds the pick against two trees started twice, the 4-token one (truly 2 %
    below the 6-token one) measured 2 % lucky so it has the best mean by a hair. The duel used
    to go to the best mean, truly 2.8 % above the floor, which needs twice the starts of the
    6-token tree's 5 % (field3x/quick seed 2: 9 starts a side, then the pick fell back to the
    floor); the split model, whose ratio of two trees rests on their accept lengths, puts the
    6-token tree ahead, so it duels the floor."""
    hand = Candidate(nccl_env=(("NCCL_PROTO", "LL"), ("NCCL_ALGO", "Ring")),
                     spec=SpecSettings("EAGLE3", 2, 1, 3))  # fmt: skip
    chain = _field_chain(10, 2)[0]
    obs = _starts(0, None, 61.0, None, role="baseline")
    obs += [Observation(40 + i, hand, TrialState.COMPLETE, runs=tuple(v * f for v in chain.runs),
                        accept_histogram=chain.accept_histogram, role="enqueued[0]")
            for i, f in enumerate((1.04, 0.98, 1.03))]  # fmt: skip
    four, six = SpecSettings("EAGLE3", 2, 4, 4), SpecSettings("EAGLE3", 2, 4, 6)

    def scaled(o: Observation, f: float) -> Observation:
        return dataclasses.replace(o, runs=tuple(v * f for v in o.runs))

    swing = (1.03, 0.97)
    obs += [scaled(o, f) for o, f in zip(_field_chain(10, 2), swing, strict=True)]
    obs += [scaled(o, f) for o, f in zip(_field_chain(20, 3), swing, strict=True)]

    four_obs, six_obs = _field_tree(30, four), _field_tree(50, six)
    lead = six_obs[0].runs[0] / four_obs[0].runs[0]
    assert 1.01 < lead < 1.04  # the 6-token tree is truly ahead
    obs += [scaled(o, f * lead) for o, f in zip(four_obs, (1.04, 0.97), strict=True)]
    obs += [scaled(o, f * 0.999) for o, f in zip(six_obs, (1.03, 0.97), strict=True)]
    search = _search()
    view = search._view(obs, ())
    choice = pick(view.points, difference=view.evidence.difference, noise=view.evidence.noise)
    assert choice is not None and choice.point.candidate == hand
    assert choice.best.candidate.spec == four  # the best mean: the lucky 4-token tree
    proposal = search._improve(view)
    assert proposal is not None and proposal.reason.startswith("settle the best"), proposal
    assert proposal.candidate.spec == six, proposal.candidate.spec
