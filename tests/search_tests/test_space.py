from __future__ import annotations

import optuna
import pytest

from rayspec import Candidate
from rayspec import ConfigError
from rayspec import SpecSettings
from rayspec.search import SearchSpace
from rayspec.search import canonical_key
from rayspec.search._space import P_NDT
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import cached_config


@pytest.fixture
def space() -> SearchSpace:
    return SearchSpace.from_config(cached_config(TWIN_EXPERIMENT).search)


def _sample(space: SearchSpace, n: int, seed: int = 0) -> list[tuple[Candidate, dict]]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    out = []
    for _ in range(n):
        trial = study.ask()
        cand = space.suggest(trial)
        out.append((cand, dict(trial.params)))
        study.tell(trial, 0.0)
    return out


def test_topk_one_forces_draft_tokens_and_never_samples_them(space) -> None:
    for cand, params in _sample(space, 300):
        if cand.spec is None:
            assert not any(k.startswith("spec.") and k != "spec.mode" for k in params)
            continue
        ndt_keys = [k for k in params if k.startswith(P_NDT)]
        if cand.spec.eagle_topk == 1:
            assert cand.spec.num_draft_tokens == cand.spec.num_steps + 1
            assert ndt_keys == []  # one candidate, not many
        else:
            assert len(ndt_keys) == 1


def test_sampler_never_proposes_an_impossible_tree(space) -> None:
    """Only budgets the tree can hold are offered: a failed trial would teach TPE nothing."""
    seen = set()
    for cand, _ in _sample(space, 400, seed=5):
        if cand.spec is not None:
            assert cand.spec.fits_tree, cand.spec
            seen.add((cand.spec.num_steps, cand.spec.eagle_topk, cand.spec.num_draft_tokens))
    assert (1, 2, 3) in seen and (2, 2, 7) not in seen  # 7 is not declared; 8 does not fit
    assert not any(m > 1 and n < k + 1 for k, m, n in seen)  # short of the accepted path
    name, choices = space.ndt_param(2, 2)
    assert name == "spec.num_draft_tokens.from3.upto7" and choices == [3, 4, 6]
    assert space.ndt_param(3, 4) == ("spec.num_draft_tokens.from4", [4, 6, 8])
    assert space.ndt_param(1, 2) == ("spec.num_draft_tokens.upto3", [2, 3])


def test_speculative_numbers_go_together(space) -> None:
    with pytest.raises(ConfigError, match="spec.eagle_topk: required"):
        space.candidate({"spec.mode": "EAGLE3", "spec.num_steps": 2})
    with pytest.raises(ConfigError, match="spec.num_draft_tokens: required"):
        space.candidate({"spec.mode": "EAGLE3", "spec.num_steps": 2, "spec.eagle_topk": 2})


def test_impossible_tree_is_marked_not_fitting(space) -> None:
    cand = space.candidate(
        {"spec.mode": "EAGLE3", "spec.num_steps": 1, "spec.eagle_topk": 2,
         "spec.num_draft_tokens": 8}
    )  # fmt: skip
    assert cand.spec is not None and not cand.spec.fits_tree
    # steps=2, topk=2 holds 2 + 4 = 6 nodes: 7 draft tokens fit, 8 do not.
    assert SpecSettings("EAGLE3", 2, 2, 7).fits_tree
    assert not SpecSettings("EAGLE3", 2, 2, 8).fits_tree
    # A tree's budget holds its accepted path, steps + 1 tokens (SGLang 0.5.23's verify); a
    # chain's is that path by construction.
    assert SpecSettings("EAGLE3", 3, 2, 4).fits_tree
    assert not SpecSettings("EAGLE3", 3, 2, 3).holds_path
    assert not SpecSettings("EAGLE3", 3, 2, 3).fits_tree
    assert SpecSettings("EAGLE3", 3, 1, 4).holds_path


def test_params_round_trip(space) -> None:
    for cand, _ in _sample(space, 100, seed=3):
        assert space.candidate(space.params_of(cand)) == cand


def test_unset_means_absent_from_env(space) -> None:
    cand = space.candidate({"spec.mode": "off", "nccl.NCCL_PROTO": "LL"})
    assert cand.env == {"NCCL_PROTO": "LL"}
    assert space.baseline() == space.candidate({"spec.mode": "off"})


def test_canonical_key_identifies_equivalent_candidates() -> None:
    a = Candidate(nccl_env=(("NCCL_PROTO", "LL"),), spec=SpecSettings("EAGLE3", 2, 1, 3))
    b = Candidate(nccl_env=(("NCCL_PROTO", "LL"),), spec=SpecSettings("EAGLE3", 2, 1, 3))
    c = Candidate(nccl_env=(("NCCL_PROTO", "LL"),), spec=SpecSettings("EAGLE3", 3, 1, 4))
    assert canonical_key(a) == canonical_key(b) != canonical_key(c)


def test_flags_switches_and_values() -> None:
    cfg = cached_config(
        TWIN_EXPERIMENT,
        ["search.flags={--disable-custom-all-reduce: [on, off], --chunked-prefill-size: [4096]}"],
    )
    space = SearchSpace.from_config(cfg.search)
    cand = space.candidate(
        {"flags.--disable-custom-all-reduce": "on", "flags.--chunked-prefill-size": "4096"}
    )
    assert cand.flags == ("--disable-custom-all-reduce", "--chunked-prefill-size", "4096")
    assert space.candidate(space.params_of(cand)) == cand


def test_size_counts_canonical_feasible_points(space) -> None:
    # off + chain (6 steps) + trees: topk 2/4 x 6 steps x 5 budgets minus the ones that
    # do not fit; times the NCCL grid of six variables with three values each.
    trees = sum(
        SpecSettings("EAGLE3", k, m, n).fits_tree
        for k in range(1, 7)
        for m in (2, 4)
        for n in (2, 3, 4, 6, 8)
    )
    assert space.size() == (1 + 6 + trees) * 3**6
