"""The report says how sure (issue 20): a pick tied within noise is said with the rule that
chose it, an estimate above its own peak is marked with why, what each change bought is shown
against the baseline with its interval, best.yaml carries the interval and the ratio, the
terminal table counts what it left out, and parameters the search moved together are one bar."""

from __future__ import annotations

import dataclasses
import math
import os

import yaml

from rayspec._types import Candidate
from rayspec._types import SpecSettings
from rayspec.report._load import load_study_folder
from rayspec.report._markdown import render
from rayspec.report._plots import grouped_importances
from rayspec.report._plots import moved_together
from rayspec.report._plots import one_trial_only
from rayspec.report._plots import plot_importances
from rayspec.results import Row
from rayspec.results import StudyReport
from rayspec.results import gains
from rayspec.results import speculation_gain
from rayspec.results import tie_note
from rayspec.results import write_best
from rayspec.tune._report import format_gains
from rayspec.tune._report import format_table
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import cached_config
from tests.report_tests.conftest import Study

LL = (("NCCL_P2P_LEVEL", "SYS"), ("NCCL_PROTO", "LL"))


def _row(
    trial: int,
    tok_s: float,
    *,
    steps: int = 0,
    tokens: int = 0,
    nccl: tuple[tuple[str, str], ...] = (),
    peak: float | None = None,
    sd: float = 0.01,
    role: str = "",
) -> Row:
    spec = SpecSettings("EAGLE3", steps, 1, tokens) if steps else None
    cand = Candidate(nccl_env=nccl, spec=spec)
    return Row(
        trials=(trial,), label=cand.label(), candidate=cand, role=role, tok_s_mean=tok_s,
        tok_s_runs=tok_s, tok_s_peak=tok_s * 1.05 if peak is None else peak,
        accept_length=math.nan, sd=sd, starts=2, runs=30,
    )  # fmt: skip


BASE = _row(0, 60.0, role="baseline")


def _report(best: Row, *rows: Row, baseline: Row | None = BASE) -> StudyReport:
    everything = sorted({best, *rows, *((baseline,) if baseline else ())},
                        key=lambda r: -r.tok_s_mean)  # fmt: skip
    return StudyReport(
        rows=tuple(everything), baseline=baseline, best=best, failed=0, pruned=0,
        total=len(everything), fastest=everything[0],
    )  # fmt: skip


# -- tied within noise -------------------------------------------------------------------------
def test_a_pick_tied_with_a_faster_costlier_rival_says_so_and_that_it_picked_the_cheaper() -> None:
    pick = _row(7, 97.0, steps=2, tokens=4, nccl=LL)
    rival = _row(12, 97.6, steps=3, tokens=8, nccl=LL)
    note = tie_note(_report(pick, rival), margin=0.01)
    assert note.startswith("the pick is tied within noise with trial 12 (P=0.")
    p = float(note.split("(P=", 1)[1].split(" ", 1)[0])
    assert 0.5 < p < 0.95  # the rival is the likelier faster, but not surely
    assert "picked the cheaper (fewer draft tokens, then fewer steps" in note
    assert "study.pick_margin (1%)" in note


def test_a_tied_pick_with_the_best_estimate_says_the_rule_and_a_clear_pick_says_nothing() -> None:
    pick = _row(7, 97.6, steps=3, tokens=8, nccl=LL)
    close = _row(12, 97.0, steps=2, tokens=4, nccl=LL)
    note = tie_note(_report(pick, close))
    assert "with trial 12 (P=0." in note
    assert "picked the higher estimate (study.pick_margin is 0" in note
    assert "cheapest of them too" not in note  # 8 draft tokens against 4
    costly = _row(12, 97.0, steps=4, tokens=10, nccl=LL)
    assert "and it is the cheapest of them too" in tie_note(_report(pick, costly))
    far = _row(12, 80.0, steps=2, tokens=4, nccl=LL)
    assert tie_note(_report(pick, far)) == ""  # surely slower: not tied


def test_a_tie_is_said_in_best_sh_and_best_yaml(tmp_path) -> None:
    cfg = cached_config(TWIN_EXPERIMENT, out=tmp_path)
    pick = _row(7, 97.0, steps=2, tokens=4, nccl=LL)
    rival = _row(12, 97.6, steps=3, tokens=8, nccl=LL)
    paths = write_best(cfg, _report(pick, rival))
    assert paths is not None
    with open(paths[1], encoding="utf-8") as fh:
        script = fh.read().splitlines()
    tied = [line for line in script if "tied within noise with trial 12" in line]
    assert len(tied) == 1 and tied[0].startswith("# ")  # a comment line, never a command
    with open(paths[0], encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    assert "trial 12" in doc["tied_within_noise"]


# -- best.yaml ---------------------------------------------------------------------------------
def test_best_yaml_carries_the_interval_and_vs_baseline_as_a_ratio(tmp_path) -> None:
    cfg = cached_config(TWIN_EXPERIMENT, out=tmp_path)
    pick = _row(7, 96.0, steps=2, tokens=4, nccl=LL, sd=0.02)
    paths = write_best(cfg, _report(pick))
    assert paths is not None
    with open(paths[0], encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    assert doc["vs_baseline"] == 1.6  # 96 / 60: a ratio, not a fraction
    ci = doc["vs_baseline_ci95"]
    assert ci["low"] < 1.6 < ci["high"]
    half = 1.96 * 0.02 * 96.0
    assert doc["tok_s_ci95"] == {"low": round(96.0 - half, 3), "high": round(96.0 + half, 3)}
    assert doc["vs_baseline_text"] == "+60.0 %"
    assert doc["tied_within_noise"] is None


def test_without_a_baseline_best_yaml_has_no_ratio(tmp_path) -> None:
    cfg = cached_config(TWIN_EXPERIMENT, out=tmp_path)
    paths = write_best(cfg, _report(_row(7, 96.0, steps=2, tokens=4), baseline=None))
    assert paths is not None
    with open(paths[0], encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    assert doc["vs_baseline"] is None and doc["vs_baseline_ci95"] is None


# -- an estimate above its own peak ------------------------------------------------------------
def test_an_estimate_above_its_peak_is_marked_with_why_in_the_terminal_and_best_sh(
    tmp_path,
) -> None:
    lifted = _row(5, 90.0, steps=3, tokens=4, nccl=LL, peak=88.0)
    pick = _row(7, 97.0, steps=2, tokens=4, nccl=LL)
    table = format_table(_report(pick, lifted)).splitlines()
    line = next(x for x in table if x.startswith("| 5 |"))
    assert "| 90.0* | 88.0 |" in line
    assert "| 97.0 |" in next(x for x in table if x.startswith("| 7 |"))  # below its peak
    assert table[-1].startswith("* the estimate is above the best run")
    assert "fitted surface" in table[-1]
    assert not format_table(_report(pick)).splitlines()[-1].startswith("*")
    cfg = cached_config(TWIN_EXPERIMENT, out=tmp_path)
    paths = write_best(cfg, _report(lifted, pick))
    assert paths is not None
    with open(paths[1], encoding="utf-8") as fh:
        assert "# the estimate is above this configuration's peak" in fh.read()


def test_report_md_marks_an_estimate_above_its_peak_with_a_footnote(study: Study) -> None:
    data = load_study_folder(study.out_dir)
    rows = list(data.report.rows)
    lifted = dataclasses.replace(rows[1], tok_s_peak=rows[1].tok_s_mean - 1.0)
    report = dataclasses.replace(data.report, rows=(rows[0], lifted, *rows[2:]))
    text = render(dataclasses.replace(data, report=report), [], study.out_dir)
    marked = [line for line in text.splitlines() if f"{lifted.tok_s_mean:.1f}† ±" in line]
    assert len(marked) == 1 and marked[0].startswith(f"| {','.join(map(str, lifted.trials))} |")
    assert "\n† The estimate is above the best run" in text
    assert "†" not in render(data, [], study.out_dir)  # the study's own rows: none above


# -- what each change bought -------------------------------------------------------------------
def test_each_change_is_put_against_the_baseline_with_its_interval() -> None:
    nccl = _row(3, 84.0, nccl=LL)
    spec = _row(4, 78.0, steps=2, tokens=4)  # speculation on the baseline's NCCL
    joint = _row(7, 96.0, steps=2, tokens=4, nccl=LL)
    found = gains(_report(joint, nccl, spec))
    assert [g.row for g in found] == [nccl, spec, joint]
    assert [round(g.ratio, 3) for g in found] == [1.4, 1.3, 1.6]
    assert all(g.low < g.ratio < g.high for g in found)
    lines = format_gains(_report(joint, nccl, spec))
    assert lines[0].startswith("NCCL alone (speculation off): 1.40x the baseline (95 %: 1.")
    assert "trial 3: no speculation; P2P_LEVEL=SYS PROTO=LL" in lines[0]


def test_a_change_the_study_never_measured_says_not_measured() -> None:
    joint = _row(7, 96.0, steps=2, tokens=4, nccl=LL)
    lines = format_gains(_report(joint))
    assert lines[0] == "NCCL alone (speculation off): not measured (the study has no such trial)"
    assert lines[1].startswith("speculation on top (the baseline's NCCL): not measured")
    assert lines[2].startswith("the joint pick: 1.60x the baseline")


def test_speculation_is_put_against_no_speculation_on_the_picks_nccl() -> None:
    # A screened study: no speculative trial on the baseline's NCCL, but one without
    # speculation on the pick's set (the structured search's last restart).
    off = _row(11, 85.0, nccl=LL)
    other = _row(12, 90.0, nccl=(("NCCL_PROTO", "Simple"),))  # another set: not the reference
    joint = _row(7, 97.0, steps=2, tokens=4, nccl=LL)
    report = _report(joint, off, other)
    found = speculation_gain(report)
    assert found.row is joint and found.against is off
    assert math.isclose(found.ratio, 97.0 / 85.0)
    assert found.low < found.ratio < found.high
    assert gains(report)[1].row is None  # the field's own decomposition cannot say it
    line = format_gains(report)[-1]
    assert line.startswith("speculation on the pick's NCCL: 1.14x no speculation there (95 %: 1.")
    assert line.endswith(", trial 7 against trial 11 (no speculation; P2P_LEVEL=SYS PROTO=LL)")


def test_without_a_no_speculation_trial_on_the_picks_nccl_it_says_what_would_measure_it() -> None:
    joint = _row(7, 96.0, steps=2, tokens=4, nccl=LL)
    line = format_gains(_report(joint))[-1]
    assert line == (
        "speculation on the pick's NCCL: not measured (no trial ran without speculation on the "
        "pick's NCCL set; study.enqueue {spec.mode: off, nccl.NCCL_P2P_LEVEL: SYS, "
        "nccl.NCCL_PROTO: LL} measures it)"
    )
    plain = _row(7, 96.0, nccl=LL)
    assert speculation_gain(_report(plain)).missing == "the pick runs no speculation"
    # On NCCL's defaults the baseline itself is the configuration without speculation.
    default = _row(7, 72.0, steps=2, tokens=4)
    assert speculation_gain(_report(default)).against is BASE


def test_report_md_shows_what_each_change_bought(study: Study) -> None:
    with open(os.path.join(study.out_dir, "report.md"), encoding="utf-8") as fh:
        text = fh.read()
    section = text.split("## What each change bought", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")][1:]
    assert [r.split(" | ", 1)[0] for r in rows] == [
        "| NCCL alone (speculation off)", "| speculation on top (the baseline's NCCL)",
        "| the joint pick", "| speculation on the pick's NCCL",
    ]  # fmt: skip
    spec = speculation_gain(load_study_folder(study.out_dir).report)
    assert spec.against is not None and spec.against.candidate.spec is None  # measured
    assert f"{spec.ratio:.2f}x ({spec.low:.2f}-{spec.high:.2f})" in rows[3]
    assert rows[3].endswith(f"| {spec.reference} |")
    data = load_study_folder(study.out_dir)
    best = data.report.best
    assert best is not None
    joint = gains(data.report)[-1]
    assert f"{joint.ratio:.2f}x ({joint.low:.2f}-{joint.high:.2f})" in rows[2]
    assert f"{best.tok_s_mean:.1f} ±" in rows[2]


# -- the terminal table's left-out rows --------------------------------------------------------
def test_the_terminal_table_says_how_many_rows_it_left_out() -> None:
    many = [_row(t, 70.0 + t, steps=2, tokens=t + 2, nccl=LL) for t in range(1, 15)]
    report = _report(many[-1], *many)
    table = format_table(report).splitlines()
    shown = [line for line in table if line.startswith("| ") and line[2].isdigit()]
    assert len(shown) == 11  # the first 10, then the baseline
    assert table[-1] == "… 4 more configurations in report.md"
    assert "more configurations" not in format_table(report, limit=len(report.rows))
    one = format_table(report, limit=13).splitlines()[-1]
    assert one == "… 1 more configuration in report.md"


# -- importances of parameters moved together ---------------------------------------------------
def test_parameters_the_search_always_moved_together_are_one_group() -> None:
    trials = [
        {"spec.num_steps": 2, "spec.num_draft_tokens": 3, "spec.eagle_topk": 1},
        {"spec.num_steps": 3, "spec.num_draft_tokens": 4, "spec.eagle_topk": 1},
        {"spec.num_steps": 3, "spec.num_draft_tokens": 4, "spec.eagle_topk": 4},
        {},  # the baseline: neither set
    ]
    names = ["spec.num_steps", "spec.eagle_topk", "spec.num_draft_tokens"]
    assert moved_together(names, trials) == [
        ("spec.num_steps", "spec.num_draft_tokens"), ("spec.eagle_topk",),
    ]  # fmt: skip
    merged = grouped_importances(
        {"spec.num_steps": 0.3, "spec.eagle_topk": 0.4, "spec.num_draft_tokens": 0.3}, trials
    )
    assert merged == {"spec.num_steps + spec.num_draft_tokens": 0.6, "spec.eagle_topk": 0.4}
    # Moved apart once: two bars.
    apart = [*trials, {"spec.num_steps": 3, "spec.num_draft_tokens": 6, "spec.eagle_topk": 1}]
    assert len(moved_together(names, apart)) == 3


def test_the_importances_plot_has_no_two_bars_for_parameters_moved_together(
    study: Study, tmp_path
) -> None:
    data = load_study_folder(study.out_dir)
    assert data.study is not None and data.study.importances
    plot = plot_importances(data, str(tmp_path / "importances.png"))
    assert plot.path, plot.skipped
    complete = [t.params for t in data.study.trials if t.optuna_state == "COMPLETE"]
    bars = grouped_importances(data.study.importances, complete)
    firsts = [name.split(" + ")[0] for name in bars]
    assert len(moved_together(firsts, complete)) == len(firsts)  # no two bars together
    assert math.isclose(sum(bars.values()), sum(data.study.importances.values()))
    for name in (n for n in bars if " + " in n):
        assert name in plot.caption and "cannot be told apart" in plot.caption


# -- importances a user can act on -------------------------------------------------------------
def test_a_parameter_changed_by_single_trials_only_has_no_bar() -> None:
    trials = {
        0: {"spec.mode": "off", "nccl.NCCL_ALGO": "unset"},  # the baseline
        1: {"spec.mode": "EAGLE3", "nccl.NCCL_ALGO": "Ring", "spec.num_steps": 2},
        2: {"spec.mode": "EAGLE3", "nccl.NCCL_ALGO": "unset", "spec.num_steps": 3},
        3: {"spec.mode": "EAGLE3", "nccl.NCCL_ALGO": "unset", "spec.num_steps": 3},
        4: {"spec.mode": "EAGLE3", "nccl.NCCL_ALGO": "unset", "spec.num_steps": 2},
    }
    assert one_trial_only("nccl.NCCL_ALGO", trials) == (1,)
    assert one_trial_only("spec.mode + nccl.NCCL_P2P_LEVEL", trials) == (0,)
    assert one_trial_only("spec.num_steps", trials) == ()  # 2 and 3, twice each
    assert one_trial_only("spec.eagle_topk", trials) == ()  # never set: not varied either


def test_the_importances_plot_bars_only_what_several_trials_varied(study: Study, tmp_path) -> None:
    # The quickstart's study: trial 1 (enqueued) alone sets NCCL_ALGO, BUFFSIZE, MAX_NCHANNELS
    # and NTHREADS, the baseline alone runs without speculation; fANOVA gave them a third of
    # the importance before, their bar the longest.
    data = load_study_folder(study.out_dir)
    assert data.study is not None and data.study.importances
    plot = plot_importances(data, str(tmp_path / "importances.png"))
    assert plot.path, plot.skipped
    left = plot.caption.split("Left out, each changed by single trials only: ", 1)[1]
    assert "nccl.NCCL_ALGO" in left and "trial 1)" in left
    assert "spec.mode" in left and "trial 0)" in left
    completed = {t.number: t.params for t in data.study.trials if t.optuna_state == "COMPLETE"}
    bars = [n for n in grouped_importances(data.study.importances, list(completed.values()))
            if not one_trial_only(n, completed)]  # fmt: skip
    assert bars and all(n.startswith("spec.") for n in bars)
