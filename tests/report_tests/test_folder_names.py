"""Every file a study writes is one StudyFolder names (a reader never spells a name of its own)."""

from __future__ import annotations

import os

from rayspec.store import StudyFolder
from tests.report_tests.conftest import Study


def _named(root: str) -> set[str]:
    folder = StudyFolder(root)
    return {
        os.path.basename(getattr(folder, name))
        for name in dir(StudyFolder)
        if isinstance(getattr(StudyFolder, name), property)
    }


def test_every_entry_of_a_finished_study_folder_is_named(study: Study) -> None:
    on_disk = set(os.listdir(study.out_dir))
    assert on_disk - _named(study.out_dir) == set()
    for sub in ("trials", "requests"):
        for name in os.listdir(os.path.join(study.out_dir, sub)):
            assert StudyFolder.trial_number(name) is not None, name
