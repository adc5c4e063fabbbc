from __future__ import annotations

import pytest

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
