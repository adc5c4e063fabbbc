"""Resume and the report read stored trials back through the search space: the candidates are
``SearchSpace.candidate`` of the stored parameters, so a configuration keeps its identity (its
flags in the declared order) across a resume."""

from __future__ import annotations

import json

import yaml

from rayspec._config import load_config
from rayspec.search import SearchSpace
from rayspec.search import canonical_key
from rayspec.store import ParquetTrialStore
from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import write_experiment

# Declared out of name order: a reader of the sorted parameter JSON alone would swap them.
FLAGS = {"--enable-mixed-chunk": ["off", "on"], "--disable-radix-cache": ["off", "on"]}
BOTH_ON = {"spec.mode": "EAGLE3", "spec.num_steps": 3, "spec.eagle_topk": 1,
           "flags.--enable-mixed-chunk": "on", "flags.--disable-radix-cache": "on"}  # fmt: skip


def test_a_resumed_study_keeps_each_configurations_identity(tmp_path) -> None:
    with open(TWIN_EXPERIMENT, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    doc["output"]["dir"] = str(tmp_path)
    doc["study"]["max_restarts"] = 3
    doc["study"]["enqueue"] = [BOTH_ON]
    doc["search"]["flags"] = FLAGS
    path = write_experiment(str(tmp_path), doc)
    run_study(load_config(path), trial_fn=SimulatedTrials(), printer=lambda _line: None)
    cfg = load_config(path, ["study.max_restarts=5"])
    outcome = run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None)

    space = SearchSpace.from_config(cfg.search)
    rows = ParquetTrialStore(cfg.out_dir).load_trials().to_pylist()
    keys = {r["candidate_key"] for r in rows if r["candidate_key"]}
    both = space.candidate(BOTH_ON)
    assert both.flags == ("--enable-mixed-chunk", "--disable-radix-cache")
    assert canonical_key(both) in keys  # the enqueued configuration ran
    for r in rows:
        if r["candidate_key"]:
            assert canonical_key(space.candidate(json.loads(r["params"]))) == r["candidate_key"]
    # The resumed driver's report pools by the keys the study ran under.
    assert {canonical_key(row.candidate) for row in outcome.report.rows} <= keys
    assert any(row.candidate == both for row in outcome.report.rows)
