"""One comparison with the baseline for every output: the terminal table, best.sh's comment and
report.md show the same percentage (two copies of it had drifted: the terminal's divided by a
baseline of 0 tok/s, the report's did not)."""

from __future__ import annotations

import dataclasses
import math

from rayspec._types import Candidate
from rayspec._types import SpecSettings
from rayspec.report._load import load_study_folder
from rayspec.report._markdown import table_rows
from rayspec.results import Row
from rayspec.results import StudyReport
from rayspec.results import vs_baseline
from rayspec.tune._report import format_table
from tests.report_tests.conftest import Study


def _row(trial: int, tok_s: float, confidence: float = math.nan) -> Row:
    spec = None if trial == 0 else SpecSettings("EAGLE3", trial, 1, trial + 1)
    return Row(
        trials=(trial,), label=f"config {trial}", candidate=Candidate(spec=spec),
        role="baseline" if trial == 0 else "", tok_s_mean=tok_s, tok_s_runs=tok_s,
        tok_s_peak=tok_s, accept_length=math.nan, sd=0.01, starts=1, runs=3,
        vs_baseline_confidence=confidence,
    )  # fmt: skip


def _report(baseline: Row, *rows: Row) -> StudyReport:
    return StudyReport(
        rows=(*rows, baseline), baseline=baseline, best=rows[0], failed=0, pruned=0,
        total=len(rows) + 1,
    )  # fmt: skip


def test_the_baseline_itself_and_no_baseline_compare_as_a_dash() -> None:
    base = _row(0, 50.0)
    assert vs_baseline(base, base) == "—"
    assert vs_baseline(_row(2, 60.0), None) == "—"
    assert vs_baseline(_row(2, 60.0, confidence=0.99), base) == "+20.0 %"


def test_within_noise_is_said_where_asked() -> None:
    base, close = _row(0, 50.0), _row(2, 50.5, confidence=0.6)
    assert vs_baseline(close, base) == "+1.0 %"  # report.md: a flag of its own says it
    assert vs_baseline(close, base, noise=True) == "+1.0 % (within noise)"  # terminal, best.sh
    assert vs_baseline(dataclasses.replace(close, vs_baseline_confidence=0.99), base,
                       noise=True) == "+1.0 %"  # fmt: skip


def test_a_baseline_at_zero_tok_s_is_a_dash_in_the_terminal_table_too() -> None:
    base, fast = _row(0, 0.0), _row(2, 60.0, confidence=1.0)
    table = format_table(_report(base, fast))
    assert table.splitlines()[2].endswith("| — |")


def test_the_terminal_table_and_the_report_agree_on_every_row(study: Study) -> None:
    data = load_study_folder(study.out_dir)
    terminal = format_table(data.report, limit=len(data.report.rows)).splitlines()[2:]
    by_trials = {e["trials"]: e["vs_baseline"] for e in table_rows(data) if e["starts"]}
    for row, line in zip(data.report.rows, terminal, strict=False):
        cell = line.rstrip(" |").rsplit("| ", 1)[1]
        assert cell.removesuffix(" (within noise)") == by_trials[row.trials]
