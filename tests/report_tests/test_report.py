"""The report of a simulated study: the table against the trial rows, the plots as PNGs, the
command line, and the driver's hook."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys

import matplotlib.image
import pyarrow.parquet as pq
import pytest

from rayspec.report import write_report
from rayspec.report.__main__ import main
from rayspec.report._load import load_study_folder
from rayspec.report._markdown import table_rows
from rayspec.search import SearchSpace
from rayspec.search import canonical_key
from rayspec.store import StudyFolder
from rayspec.store import trial_schema
from tests.helpers import REPO
from tests.report_tests.conftest import Study
from tests.report_tests.conftest import simulated_study

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def _rows(study: Study) -> dict[int, dict]:
    table = pq.read_table(os.path.join(study.out_dir, "trials"))
    return {int(r["trial"]): r for r in table.to_pylist()}


def test_the_driver_wrote_the_report_and_said_where(study: Study) -> None:
    assert any(line.startswith("report: ") and "report.md" in line for line in study.lines)
    with open(os.path.join(study.out_dir, "report.md"), encoding="utf-8") as fh:
        text = fh.read()
    for heading in ("## Best launch command", "## Configurations", "## Plots"):
        assert heading in text
    assert "python -m sglang.launch_server" in text and "SIMULATED" in text


def test_every_trial_is_in_the_table_once_with_its_numbers(study: Study) -> None:
    rows = _rows(study)
    data = load_study_folder(study.out_dir)
    entries = table_rows(data)
    seen = [t for e in entries for t in e["trials"]]
    assert sorted(seen) == sorted(rows) and len(seen) == len(set(seen))
    for e in entries:
        trial_rows = [rows[t] for t in e["trials"]]
        if any("failed: " in f for f in e["flags"]):
            for row in trial_rows:  # failed alike: one entry
                assert row["state"] == "FAIL" and f"failed: {row['failure']}" in e["flags"]
                assert e["config"] == row["candidate"]
            continue
        assert all(r["candidate"] == e["config"] for r in trial_rows)
        runs = [v for r in trial_rows for v in json.loads(r["run_values"])]
        assert e["peak"] == pytest.approx(max(runs), abs=1e-3)
        assert e["runs"] == len(runs) and e["starts"] == len(trial_rows)
        accepts = [r["accept_length"] for r in trial_rows if _finite(r["accept_length"])]
        if accepts:
            assert e["accept_length"] == pytest.approx(sum(accepts) / len(accepts))
        else:
            assert math.isnan(e["accept_length"])
        assert ("pruned: trial" in " ".join(e["flags"])) == any(
            r["state"] == "PRUNED" for r in trial_rows
        )
    # The baseline row, the pick, and the wrong_output failure the gate caught.
    flags = {t: e["flags"] for e in entries for t in e["trials"]}
    assert "baseline" in flags[0]
    assert "**picked**" in flags[study.outcome.report.best.trial]
    assert any("failed: wrong_output" in f for fl in flags.values() for f in fl)


def test_the_markdown_table_shows_every_entry(study: Study) -> None:
    with open(os.path.join(study.out_dir, "report.md"), encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| trials | config |"))
    body = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        body.append(line)
    entries = table_rows(load_study_folder(study.out_dir))
    assert len(body) == len(entries)
    for line, e in zip(body, entries, strict=True):
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        assert cells[0] == ",".join(str(t) for t in e["trials"])
        if math.isfinite(e["tok_s"]):
            assert cells[2].startswith(f"{e['tok_s']:.1f}")
            assert cells[3] == f"{e['peak']:.1f}"


def test_at_least_four_plots_are_valid_pngs(study: Study) -> None:
    folder = os.path.join(study.out_dir, "plots")
    pngs = sorted(f for f in os.listdir(folder) if f.endswith(".png"))
    assert len(pngs) >= 4, pngs
    for name in pngs:
        path = os.path.join(folder, name)
        assert os.path.getsize(path) > 0
        with open(path, "rb") as fh:
            assert fh.read(8) == PNG_MAGIC
        image = matplotlib.image.imread(path)
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
    assert {"history.png", "steps_topk.png", "accept_length.png", "importances.png"} <= set(pngs)


def test_every_trial_file_has_the_one_schema(study: Study) -> None:
    table = pq.read_table(os.path.join(study.out_dir, "trials"))
    assert table.schema.names == trial_schema().names


def test_optuna_study_and_trials_carry_what_the_dashboard_shows(study: Study) -> None:
    data = load_study_folder(study.out_dir)
    assert data.study is not None
    attrs = data.study.user_attrs
    assert attrs["experiment"] == "eagle3-twin" and attrs["engine"] == "twin"
    assert attrs["twin_profile"] == "kimi-k2.5-tp8-pcie" and attrs["sglang_version"]
    assert attrs["max_restarts"] == 12
    trials = {t.number: t.user_attrs for t in data.study.trials}
    rows = _rows(study)
    for number, row in rows.items():
        t = trials[number]
        assert t["candidate"] == row["candidate"] and t["state"] == row["state"]
        if row["state"] == "COMPLETE":
            assert t["tok_s_mean"] == pytest.approx(row["tok_s_mean"])
        if row["state"] == "FAIL":
            assert t["failure_reason"] == row["failure"]
        if _finite(row["accept_length"]) and row["state"] != "FAIL":
            assert t["accept_length"] == pytest.approx(row["accept_length"])


def test_the_command_line_rebuilds_it_without_the_study(study: Study, tmp_path) -> None:
    copy = str(tmp_path / "copy")
    shutil.copytree(study.out_dir, copy, ignore=shutil.ignore_patterns("report.md", "plots"))
    os.remove(os.path.join(copy, "optuna.journal"))  # importances need the study: skipped
    assert main([copy]) == 0
    with open(os.path.join(copy, "report.md"), encoding="utf-8") as fh:
        text = fh.read()
    assert "Not drawn: no Optuna journal" in text
    assert len([f for f in os.listdir(os.path.join(copy, "plots")) if f.endswith(".png")]) >= 3
    # The same table as the driver's report.
    assert table_rows(load_study_folder(copy)) == table_rows(load_study_folder(study.out_dir))


def test_the_report_candidates_are_the_search_spaces_own(study: Study) -> None:
    with open(StudyFolder(study.out_dir).search_space, encoding="utf-8") as fh:
        space = SearchSpace.from_json(fh.read())
    data = load_study_folder(study.out_dir)
    rows = _rows(study)
    assert [r.trial for r in data.records] == sorted(rows)
    for record in data.records:
        params = json.loads(rows[record.trial]["params"])
        assert record.candidate == space.candidate(params)
        if rows[record.trial]["candidate_key"]:  # the configuration the study ran
            assert canonical_key(record.candidate) == rows[record.trial]["candidate_key"]
        assert list(record.run_values) == json.loads(rows[record.trial]["run_values"] or "[]")
    by_trial = {r.trial: r for r in data.records}
    for row in data.report.rows:
        assert row.candidate == by_trial[row.trial].candidate


def test_an_older_folder_reads_its_space_from_the_optuna_study(study: Study, tmp_path) -> None:
    copy = str(tmp_path / "copy")
    shutil.copytree(study.out_dir, copy, ignore=shutil.ignore_patterns("report.md", "plots"))
    os.remove(StudyFolder(copy).search_space)  # a study written before the folder kept it
    assert table_rows(load_study_folder(copy)) == table_rows(load_study_folder(study.out_dir))
    os.remove(os.path.join(copy, "optuna.journal"))
    assert main([copy]) == 2  # no space to read the parameters with: one line, exit 2


def test_bad_input_is_one_line_and_exit_2(tmp_path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "rayspec.report", "/nonexistent"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0 and "/nonexistent" in run.stderr
    assert main([str(tmp_path)]) == 2  # a folder, but not a study folder


def test_a_report_failure_is_one_warning_and_never_the_studys(tmp_path, monkeypatch) -> None:
    import rayspec.report

    def broken(path: str, cfg: object = None) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(rayspec.report, "write_report", broken)
    made = simulated_study(str(tmp_path), max_restarts=2, write_report=True)
    warnings = [line for line in made.lines if line.startswith("warning: report not written")]
    assert len(warnings) == 1 and "disk on fire" in warnings[0]
    assert made.outcome.report.best is not None


def test_write_report_returns_what_it_wrote(study: Study) -> None:
    files = write_report(study.out_dir)
    assert files.markdown == os.path.join(study.out_dir, "report.md")
    assert len(files.drawn) >= 4 and all(os.path.isfile(p.path) for p in files.drawn)
    assert all(p.skipped for p in files.plots if not p.path)


def test_a_journal_with_a_torn_tail_is_read_as_optuna_replays_it(study: Study, tmp_path) -> None:
    """A crash mid-append leaves a last line that is not UTF-8, on which Optuna's own reader
    trips: the report reads the records before it (from a copy), and writes nothing there."""
    copy = str(tmp_path / "copy")
    shutil.copytree(study.out_dir, copy, ignore=shutil.ignore_patterns("report.md", "plots"))
    journal = StudyFolder(copy).journal
    with open(journal, "ab") as fh:
        fh.write(b'{"op_code": 5, "worker_id": "\xff\xfe')  # torn: no newline, not UTF-8
    with open(journal, "rb") as fh:
        before = fh.read()
    files = sorted(os.listdir(copy))
    data = load_study_folder(copy)
    assert data.study is not None, data.study_note
    assert data.study.importances and data.attrs["engine"] == "twin"
    assert table_rows(data) == table_rows(load_study_folder(study.out_dir))
    with open(journal, "rb") as fh:
        assert fh.read() == before  # read-only: no repair
    assert sorted(os.listdir(copy)) == files  # and no lock file left beside it
