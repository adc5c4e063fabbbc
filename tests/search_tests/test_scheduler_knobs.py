"""``search.scheduler``: SGLang's scheduler knobs as parameters, candidates and launch lines."""

from __future__ import annotations

import dataclasses

import optuna
import pytest

from rayspec import Candidate
from rayspec import ConfigError
from rayspec.search import SearchSpace
from rayspec.search import canonical_key
from rayspec.server import build_launch
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import cached_config

KNOBS = [
    "search.scheduler.max_running_requests=[16,64]",
    "search.scheduler.cuda_graph_max_bs=[16,64]",
    "search.scheduler.chunked_prefill_size=[-1,2048]",
    "search.speculative.modes=[off,EAGLE3]",
    "search.speculative.num_steps=[2]",
    "search.speculative.eagle_topk=[1]",
]
CHAIN = {"spec.mode": "EAGLE3", "spec.num_steps": 2, "spec.eagle_topk": 1}


@pytest.fixture
def cfg():
    return cached_config(TWIN_EXPERIMENT, KNOBS)


@pytest.fixture
def space(cfg) -> SearchSpace:
    # NCCL and flags left out: the knobs' own points are counted
    return dataclasses.replace(SearchSpace.from_config(cfg.search), nccl=(), flags=())


def _value(argv: tuple[str, ...], flag: str) -> str:
    assert argv.count(flag) == 1, argv
    return argv[argv.index(flag) + 1]


def test_knobs_are_parameters_and_the_candidate_carries_them(space) -> None:
    grid = space.grid()
    assert grid["sched.max_running_requests"] == [16, 64]
    assert grid["sched.chunked_prefill_size"] == [-1, 2048]
    params = {**CHAIN, "sched.max_running_requests": 64, "sched.cuda_graph_max_bs": 16}
    cand = space.candidate(params)
    assert cand.knobs == {"max_running_requests": 64, "cuda_graph_max_bs": 16}
    assert space.params_of(cand) == params
    assert "max-running=64" in cand.label() and "graph-bs=16" in cand.label()
    # study.enqueue and overrides give text: the knobs read as ints
    assert space.coerce({"sched.max_running_requests": "64"}) == {"sched.max_running_requests": 64}
    with pytest.raises(ConfigError, match="sched.max_running_requests: 32 is not one of"):
        space.candidate({**CHAIN, "sched.max_running_requests": 32})


def test_a_graph_cap_above_the_running_cap_is_the_capped_candidate(space) -> None:
    above = space.candidate(
        {**CHAIN, "sched.max_running_requests": 16, "sched.cuda_graph_max_bs": 64}
    )
    equal = space.candidate(
        {**CHAIN, "sched.max_running_requests": 16, "sched.cuda_graph_max_bs": 16}
    )
    assert canonical_key(above) == canonical_key(equal)
    points = space.grid_points()
    assert len(points) == space.size()
    # 2 speculative points x 2 chunk sizes x (16/16, 64/16, 64/64): 16/64 repeats 16/16
    assert space.size() == 2 * 2 * 3
    assert len({canonical_key(space.candidate(p)) for p in points}) == len(points)


def test_a_candidate_without_knobs_keeps_its_old_key_and_the_space_round_trips(space) -> None:
    plain = Candidate()
    assert "scheduler" not in canonical_key(plain)
    assert SearchSpace.from_json(space.to_json()) == space
    old = space.to_json().replace(', "scheduler": [', ', "ignored": [')
    assert SearchSpace.from_json(old).scheduler == ()
    assert SearchSpace.from_grid(space.grid()).scheduler == space.scheduler


def test_the_sampler_sets_every_knob_but_a_queued_baseline_none(space) -> None:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    base = space.params_of(space.baseline())
    study.enqueue_trial(base, user_attrs={"queued_params": base})
    first = space.suggest(study.ask())
    assert first.scheduler == ()  # the baseline runs the server's values
    for _ in range(5):
        cand = space.suggest(study.ask())
        assert set(cand.knobs) == {
            "max_running_requests", "cuda_graph_max_bs", "chunked_prefill_size",
        }  # fmt: skip


def test_the_launch_passes_the_knobs_once_in_place_of_the_servers(cfg, space) -> None:
    cand = space.candidate({
        **CHAIN, "sched.max_running_requests": 64, "sched.cuda_graph_max_bs": 16,
        "sched.chunked_prefill_size": -1,
    })  # fmt: skip
    argv = build_launch(cfg, cand, port=1, log_path="-").argv
    assert _value(argv, "--max-running-requests") == "64"
    assert _value(argv, "--cuda-graph-max-bs-decode") == "16"
    assert _value(argv, "--chunked-prefill-size") == "-1"
    base = build_launch(cfg, Candidate(), port=1, log_path="-").argv
    assert _value(base, "--max-running-requests") == str(cfg.server.max_running_requests)
    assert "--chunked-prefill-size" not in base
    # A searched running cap alone: the graph cap follows it (unless server.cuda_graph_max_bs).
    cfg.server.cuda_graph_max_bs = None
    only = space.candidate({**CHAIN, "sched.max_running_requests": 16})
    argv = build_launch(cfg, only, port=1, log_path="-").argv
    assert _value(argv, "--cuda-graph-max-bs-decode") == "16"


def test_the_store_has_a_column_per_knob() -> None:
    from rayspec._schema import SCHEDULER_KNOBS
    from rayspec.store._parquet import TRIAL_SCHEMA

    assert {f"sched_{k}" for k in SCHEDULER_KNOBS} <= set(TRIAL_SCHEMA.names)
