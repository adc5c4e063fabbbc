"""The report's per-category table: the pick against the baseline, shown only for a prompt set
of several categories."""

from __future__ import annotations

import math

import pyarrow.parquet as pq
import yaml

from rayspec._config import load_config
from rayspec._types import category_key
from rayspec.report._categories import SHOWN_CATEGORIES
from rayspec.report._categories import category_rows
from rayspec.report._load import load_study_folder
from rayspec.report._markdown import render
from rayspec.store import ParquetTrialStore
from rayspec.store._categories import category_table
from rayspec.store._categories import split_categories
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
    assert sorted(e["category"] for e in entries) == ["chat", "code", "long-form", "math"]
    best = data.report.best
    assert best is not None and data.report.baseline is not None
    stored = ParquetTrialStore(data.path).category_rows(set(best.trials))
    assert sum(e["requests"] for e in entries) == sum(r["requests"] for r in stored) > 0
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
    assert data.categories == []
    assert "By prompt category" not in render(data, [], str(tmp_path))


def _with_categories(folder: str, names: list[str]) -> str:
    """The mixed study with the pick's and the baseline's figures over ``names`` instead."""
    out = _mixed_study(folder)
    data = load_study_folder(out)
    assert data.report.best is not None and data.report.baseline is not None
    for trial in {*data.report.best.trials, *data.report.baseline.trials}:
        metrics = {}
        for i, name in enumerate(names):
            metrics[category_key(name, "requests")] = float(len(names) - i)
            metrics[category_key(name, "tok_s")] = 50.0 + i
        _, by_cat = split_categories(metrics)
        path = ParquetTrialStore(out).folder.category_file(trial)
        pq.write_table(category_table(trial, by_cat), path)
    return out


def _section(text: str) -> str:
    return text.split("## By prompt category", 1)[1].split("\n## ", 1)[0]


def test_the_category_table_is_bounded_and_sums_up_the_rest(tmp_path) -> None:
    names = [f"c{i:04d}" for i in range(500)]
    data = load_study_folder(_with_categories(str(tmp_path), names))
    section = _section(render(data, [], str(tmp_path)))
    rows = [line for line in section.splitlines() if line.startswith("| c0")]
    # the pick's most requested first: c0000 has the most requests
    assert [r.split(" | ")[0] for r in rows] == [f"| {n}" for n in names[:SHOWN_CATEGORIES]]
    rest = sum(500 - i for i in range(SHOWN_CATEGORIES, 500)) * len(data.report.best.trials)
    assert f"… and {500 - SHOWN_CATEGORIES} more categories ({rest} of the pick's" in section


def test_a_category_name_is_escaped_and_cut_in_the_table(tmp_path) -> None:
    names = ["line\nbreak", "pipe|name", "<img src=x onerror=alert(1)>", "w" * 3000, "plain"]
    data = load_study_folder(_with_categories(str(tmp_path), names))
    section = _section(render(data, [], str(tmp_path)))
    rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    rows = rows[1:]  # the header
    assert len(rows) == len(names)  # none dropped, none split over two lines
    cells = [r.split(" | ")[0][2:] for r in rows]
    assert cells[0] == "line\\nbreak" and cells[1] == "pipe\\|name"
    assert cells[2] == "&lt;img src=x onerror=alert(1)&gt;" and "<img" not in section
    assert cells[3] == "w" * 80 + "… (3000 characters)"
    for r in rows:  # every row keeps its 7 cells: no unescaped | inside a name
        assert len(r.replace("\\|", "").split("|")) == 9
