"""A study folder for the report tests: the quickstart's experiment on simulated twin starts
(rayspec.testing.SimulatedTrials: no Ray, seconds), with an enqueued LL128 configuration that the
correctness gate fails as wrong_output."""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import yaml

from rayspec._config import load_config
from rayspec.testing import SimulatedTrials
from rayspec.tune import StudyOutcome
from rayspec.tune import run_study
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import write_experiment

LL128 = {"spec.mode": "EAGLE3", "spec.num_steps": 3, "spec.eagle_topk": 1,
         "nccl.NCCL_PROTO": "LL128", "nccl.NCCL_P2P_LEVEL": "SYS"}  # fmt: skip


@dataclass(frozen=True)
class Study:
    out_dir: str
    outcome: StudyOutcome
    lines: list[str]


def simulated_study(folder: str, max_restarts: int = 12, **kwargs: object) -> Study:
    with open(TWIN_EXPERIMENT, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    doc["output"]["dir"] = folder
    doc["study"]["max_restarts"] = max_restarts
    doc["study"]["enqueue"].append(LL128)
    doc["search"]["nccl"]["NCCL_PROTO"].append("LL128")
    cfg = load_config(write_experiment(folder, doc))
    lines: list[str] = []
    outcome = run_study(cfg, trial_fn=SimulatedTrials(), printer=lines.append, **kwargs)
    return Study(cfg.out_dir, outcome, lines)


@pytest.fixture(scope="session")
def study(tmp_path_factory: pytest.TempPathFactory) -> Study:
    """A finished simulated study whose driver wrote its report (as python -m rayspec.tune)."""
    made = simulated_study(str(tmp_path_factory.mktemp("report")), write_report=True)
    assert os.path.isfile(os.path.join(made.out_dir, "report.md")), made.lines[-3:]
    return made
