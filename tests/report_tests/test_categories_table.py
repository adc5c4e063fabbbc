"""The report's per-category table: the pick against the baseline, shown only for a prompt set
of several categories."""

from __future__ import annotations

import math

import yaml

from rayspec._config import load_config
from rayspec._types import category_key
from rayspec.report._categories import category_rows
from rayspec.report._load import load_study_folder
from rayspec.report._markdown import render
from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import write_experiment
from tests.report_tests.conftest import Study


def _mixed_study(folder: str) -> str:
    with open(TWIN_EXPERIMENT, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    doc["output"]["dir"] = folder
    doc["study"]["max_restarts"] = 3
    doc["bench"].update({"prompts": "mixed", "repeats": 4, "max_tokens": 120})
    cfg = load_config(write_experiment(folder, doc))
    run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None)
    return cfg.out_dir


def test_a_mixed_study_reports_the_pick_and_the_baseline_by_category(tmp_path) -> None:
    data = load_study_folder(_mixed_study(str(tmp_path)))
    entries = category_rows(data)
    assert [e["category"] for e in entries] == ["chat", "code", "long-form", "math"]
    best = data.report.best
    assert best is not None and data.report.baseline is not None
    picked = [r for r in data.rows if r["trial"] in best.trials]
    stored = sum(r[category_key(e["category"], "requests")] or 0 for e in entries for r in picked)
    assert sum(e["requests"] for e in entries) == stored
    for e in entries:
        if e["requests"] and e["baseline_requests"]:
            assert math.isclose(e["ratio"], e["tok_s"] / e["baseline_tok_s"])
    text = render(data, [], str(tmp_path))
    assert "## By prompt category" in text
    assert "| code |" in text and "| chat |" in text


def test_a_study_of_one_category_has_no_category_table(study: Study, tmp_path) -> None:
    data = load_study_folder(study.out_dir)
    assert category_rows(data) == []
    assert not any(k.startswith("category__") for r in data.rows for k in r)
    assert "By prompt category" not in render(data, [], str(tmp_path))
