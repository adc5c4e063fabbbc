"""The one check at start that the journal and the Parquet trial files agree: refused with one
line, or rebuilt, and a measured row never overwritten."""

from __future__ import annotations

import dataclasses
import os
import shutil

import pytest

from rayspec._exceptions import ConfigError
from rayspec._exceptions import StoreError
from rayspec.store import ParquetTrialStore
from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study
from tests.reliability_tests._support import journal_trials
from tests.reliability_tests._support import quiet
from tests.reliability_tests._support import row_hashes
from tests.reliability_tests._support import twin_cfg


def _study(tmp_path, restarts: int):
    cfg = twin_cfg(str(tmp_path), f"study.max_restarts={restarts}")
    run_study(cfg, printer=quiet, trial_fn=SimulatedTrials())
    return cfg


def _trial_file(cfg, n: int, folder: str = "trials") -> str:
    return os.path.join(cfg.out_dir, folder, f"trial-{n:06d}.parquet")


def test_a_deleted_journal_is_refused_and_no_row_is_overwritten(tmp_path) -> None:
    cfg = _study(tmp_path, 2)
    before = row_hashes(cfg)
    os.remove(cfg.storage_url)
    with pytest.raises(ConfigError, match=r"holds no study 'eagle3-twin'.*journal was deleted"):
        run_study(cfg, printer=quiet, trial_fn=SimulatedTrials())
    assert row_hashes(cfg) == before
    assert not os.path.exists(cfg.storage_url)  # refused before anything was written


def test_a_journal_cut_back_is_refused_and_no_row_is_overwritten(tmp_path) -> None:
    cfg = _study(tmp_path, 2)
    saved = str(tmp_path / "journal-after-2")
    shutil.copyfile(cfg.storage_url, saved)
    more = twin_cfg(str(tmp_path), "study.max_restarts=4")
    run_study(more, printer=quiet, trial_fn=SimulatedTrials())
    before = row_hashes(cfg)
    shutil.copyfile(saved, cfg.storage_url)  # the journal lost its tail
    with pytest.raises(ConfigError, match=r"has no trial 2, 3, which .* holds"):
        run_study(more, printer=quiet, trial_fn=SimulatedTrials())
    assert row_hashes(cfg) == before


def test_a_deleted_trial_file_is_rebuilt_with_its_role_runs_and_restart(tmp_path) -> None:
    """The issue's case: the enqueued trial's file deleted. Rebuilt from the journal, it keeps
    its role and runs (so the pick still has it) and counts its restart (no overspend)."""
    cfg = _study(tmp_path, 3)
    rows = {r["trial"]: r for r in ParquetTrialStore(cfg.out_dir).load_trials().to_pylist()}
    os.remove(_trial_file(cfg, 1))
    lines: list[str] = []
    outcome = run_study(cfg, printer=lines.append, trial_fn=SimulatedTrials())
    assert (
        "trial 1: its trial file was missing; row rebuilt from the journal (its request "
        "rows are kept)" in lines
    ), lines
    assert outcome.ran == 0 and outcome.restarts == 3  # nothing more launched: 3 of 3
    again = {r["trial"]: r for r in ParquetTrialStore(cfg.out_dir).load_trials().to_pylist()}
    for column in ("state", "value", "role", "run_values", "candidate_key", "restart", "command"):
        assert again[1][column] == rows[1][column], column
    assert again[1]["role"] == "enqueued[0]"
    assert 1 in outcome.report.best.trials or outcome.report.best.role == "enqueued[0]"


def test_a_truncated_trial_file_is_set_aside_and_rebuilt(tmp_path) -> None:
    cfg = _study(tmp_path, 2)
    path = _trial_file(cfg, 1)
    with open(path, "r+b") as fh:
        fh.truncate(os.path.getsize(path) // 2)
    lines: list[str] = []
    run_study(cfg, printer=lines.append, trial_fn=SimulatedTrials())
    assert any(line.startswith(f"store: {path} cannot be read") for line in lines), lines
    assert os.path.exists(os.path.join(cfg.out_dir, "trials", ".damaged-trial-000001.parquet"))
    assert sorted(row_hashes(cfg)) == sorted(journal_trials(cfg))


def test_a_journal_of_other_runs_is_refused(tmp_path) -> None:
    """Same trial numbers, other measurements: the values differ, refused."""
    cfg = _study(tmp_path / "a", 2)
    other = twin_cfg(str(tmp_path / "b"), "study.max_restarts=2", "study.seed=7",
                     "server.twin.seed=3")  # fmt: skip
    run_study(other, printer=quiet, trial_fn=SimulatedTrials())
    shutil.copyfile(other.storage_url, cfg.storage_url)
    before = row_hashes(cfg)
    with pytest.raises(ConfigError, match=r"disagree \(trial \d has value"):
        run_study(cfg, printer=quiet, trial_fn=SimulatedTrials())
    assert row_hashes(cfg) == before


def test_the_store_never_overwrites_another_attempts_row(tmp_path) -> None:
    from rayspec.results import candidate_reader
    from rayspec.search import SearchSpace

    cfg = _study(tmp_path, 1)
    store = ParquetTrialStore(cfg.out_dir)
    (record,) = store.load_records(candidate_reader(SearchSpace.from_config(cfg.search)))
    before = row_hashes(cfg)
    later = dataclasses.replace(record.result, start_unix_s=record.result.start_unix_s + 60)
    with pytest.raises(StoreError, match=r"refusing to overwrite .*measured runs of trial 0"):
        store.append_trial(dataclasses.replace(record, result=later))
    assert row_hashes(cfg) == before
    store.append_trial(record)  # the same attempt written again: allowed
    assert row_hashes(cfg) == before
