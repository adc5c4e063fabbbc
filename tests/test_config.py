from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from rayspec import ConfigError
from rayspec._config import Engine
from rayspec._config import Sampler
from rayspec._config import load_config
from tests.helpers import FIELD_EXPERIMENT
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import twin_doc
from tests.helpers import write_experiment


def test_twin_experiment_loads_with_overrides() -> None:
    cfg = load_config(TWIN_EXPERIMENT, ["study.n_trials=40", "bench.repeats=2"])
    assert cfg.study.n_trials == 40
    assert cfg.bench.repeats == 2
    assert cfg.server.engine is Engine.twin
    assert cfg.study.sampler is Sampler.structured  # the default search
    assert cfg.storage_url.endswith("eagle3-twin/optuna.journal")
    # "unset" is always a choice, first.
    assert all(choices[0] == "unset" for choices in cfg.search.nccl.values())
    # YAML's unquoted `off` is a boolean; the loader gives it back as the mode name.
    assert cfg.search.speculative.modes == ["off", "EAGLE3"]


def test_field_experiment_needs_model_paths() -> None:
    with pytest.raises(ConfigError, match="server.model_path"):
        load_config(FIELD_EXPERIMENT)
    with pytest.raises(ConfigError, match="server.draft_model_path"):
        load_config(FIELD_EXPERIMENT, ["server.model_path=org/kimi"])
    cfg = load_config(
        FIELD_EXPERIMENT, ["server.model_path=org/kimi", "server.draft_model_path=org/draft"]
    )
    assert cfg.server.engine is Engine.sglang
    assert cfg.bench.max_tokens == 500 and cfg.bench.repeats == 5 and cfg.bench.warmup == 1


def test_unset_is_added_and_deduplicated(tmp_path) -> None:
    doc = twin_doc(str(tmp_path), search={"nccl": {"NCCL_PROTO": ["LL", "LL", "Simple"]}})
    cfg = load_config(write_experiment(str(tmp_path), doc))
    assert cfg.search.nccl == {"NCCL_PROTO": ["unset", "LL", "Simple"]}


def test_yaml_layers_merge_in_order(tmp_path) -> None:
    base = write_experiment(str(tmp_path), twin_doc(str(tmp_path)))
    layer = write_experiment(str(tmp_path), {"cluster": {"max_concurrent_trials": 3}}, "c.yaml")
    cfg = load_config(base, [layer, "cluster.max_concurrent_trials=2"])
    assert cfg.cluster.max_concurrent_trials == 2
    cfg = load_config(base, [layer])
    assert cfg.cluster.max_concurrent_trials == 3


def test_defaults_are_safe(tmp_path) -> None:
    cfg = load_config(write_experiment(str(tmp_path), twin_doc(str(tmp_path))))
    assert cfg.server.host == "127.0.0.1"
    assert cfg.cluster.dashboard_host == "127.0.0.1"
    assert cfg.server.allow_nvlink_multicast is False


def test_a_ladder_is_one_scenario_per_rung_with_the_objective_first() -> None:
    cfg = load_config(TWIN_EXPERIMENT, [
        "bench.ladder.concurrency=[1,8,64]", "bench.ladder.request_rate=[0.5,4]",
        "bench.max_tokens=120", "study.objective_scenario=c8",
    ])  # fmt: skip
    got = [(sc.name, sc.concurrency, sc.requests_per_run, sc.request_rate, sc.max_tokens)
           for sc in cfg.scenarios()]  # fmt: skip
    assert got == [
        ("c8", 8, 8, None, 120),
        ("c1", 1, 1, None, 120),
        ("c64", 64, 64, None, 120),
        ("r0p5", 64, 32, 0.5, 120),
        ("r4", 64, 32, 4.0, 120),
    ]


@given(
    rungs=st.lists(st.integers(1, 512), min_size=1, max_size=6, unique=True),
    rates=st.lists(st.sampled_from([0.25, 0.5, 2.0, 3.5, 16.0]), max_size=3, unique=True),
    per_run=st.one_of(st.none(), st.integers(1, 100)),
)
@settings(max_examples=40, deadline=None)
def test_every_ladder_rung_becomes_a_valid_uniquely_named_scenario(rungs, rates, per_run) -> None:
    overrides = [f"bench.ladder.concurrency=[{','.join(map(str, rungs))}]"]
    if rates:
        overrides.append(f"bench.ladder.request_rate=[{','.join(map(str, rates))}]")
    if per_run is not None:
        overrides.append(f"bench.ladder.requests_per_run={per_run}")
    scenarios = load_config(TWIN_EXPERIMENT, overrides).scenarios()  # validated on load
    assert len({sc.name for sc in scenarios}) == len(scenarios) == len(rungs) + len(rates)
    assert sorted(sc.concurrency for sc in scenarios if sc.request_rate is None) == sorted(rungs)
    assert sorted(sc.request_rate or 0 for sc in scenarios if sc.request_rate) == sorted(rates)
    assert all(sc.requests_per_run == (per_run or sc.concurrency) for sc in scenarios
               if sc.request_rate is None)  # fmt: skip
