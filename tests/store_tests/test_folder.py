"""StudyFolder: the names of a study's files, and the store reading them back as plain data."""

from __future__ import annotations

import os

from rayspec.store import ParquetTrialStore
from rayspec.store import StudyFolder


def test_a_trial_files_name_reads_back_as_its_number() -> None:
    for number in (0, 7, 123456):
        assert StudyFolder.trial_number(StudyFolder.trial_name(number)) == number
    for other in ("trial-12.json", ".trial-000001.parquet.tmp", "trial-x.parquet",
                  StudyFolder.damaged_name(3), "notes.parquet"):  # fmt: skip
        assert StudyFolder.trial_number(other) is None


def test_paths_sit_in_the_folder_as_given() -> None:
    folder = StudyFolder("runs/s")
    assert folder.trial_file(3) == os.path.join("runs/s", "trials", "trial-000003.parquet")
    assert folder.request_file(3) == os.path.join("runs/s", "requests", "trial-000003.parquet")
    assert folder.log_file(3) == os.path.join("runs/s", "logs", "trial-000003.log")
    assert os.path.dirname(folder.ray_metrics) == "runs/s"


def test_an_empty_folder_reads_as_no_rows_and_no_concurrency(tmp_path) -> None:
    store = ParquetTrialStore(str(tmp_path))
    assert store.trial_rows() == []
    assert store.scenario_concurrency() == {}
    assert store.folder == StudyFolder(str(tmp_path))
