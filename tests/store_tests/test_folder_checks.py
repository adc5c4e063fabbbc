"""A study folder the study cannot write is refused in one line before the first launch, and no
write goes through a link planted in it."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayspec._atomic import write_atomic
from rayspec._config import load_config
from rayspec._exceptions import ConfigError
from rayspec.results._saved import write_text
from rayspec.store import StudyFolder
from rayspec.store import folder_problems
from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study
from tests.helpers import twin_doc
from tests.helpers import write_experiment


def _victim(tmp_path: Any) -> str:
    path = str(tmp_path / "victim")
    with open(path, "w") as fh:
        fh.write("outside\n")
    os.chmod(path, 0o600)
    return path


def _untouched(path: str) -> None:
    with open(path) as fh:
        assert fh.read() == "outside\n"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_a_link_at_the_old_temporary_name_is_not_followed(tmp_path) -> None:
    victim = _victim(tmp_path)
    script = str(tmp_path / "study" / "best.sh")
    os.makedirs(os.path.dirname(script))
    os.symlink(victim, script + ".tmp")
    write_text(script, "#!/usr/bin/env bash\n", mode=0o755)
    _untouched(victim)
    assert stat.S_IMODE(os.stat(script).st_mode) == 0o755 and not os.path.islink(script)


def test_a_link_at_the_name_itself_is_replaced_not_written_through(tmp_path) -> None:
    victim = _victim(tmp_path)
    report = str(tmp_path / "report.md")
    os.symlink(victim, report)
    write_atomic(report, "# Study\n")
    _untouched(victim)
    assert not os.path.islink(report) and open(report).read() == "# Study\n"


def test_a_subfolder_that_is_a_link_is_not_entered(tmp_path) -> None:
    root = tmp_path / "study"
    elsewhere = tmp_path / "elsewhere"
    root.mkdir()
    elsewhere.mkdir()
    os.symlink(elsewhere, root / "trials")
    with pytest.raises(OSError, match="trials is a symbolic link"):
        write_atomic(str(root / "trials" / "trial-000000.parquet"), b"x", root=str(root))
    assert os.listdir(elsewhere) == []


def test_the_study_root_itself_may_be_a_link(tmp_path) -> None:
    real = tmp_path / "scratch"
    real.mkdir()
    os.symlink(real, tmp_path / "study")
    write_atomic(str(tmp_path / "study" / "trials" / "a"), b"x", root=str(tmp_path / "study"))
    assert (real / "trials" / "a").read_bytes() == b"x"
    assert folder_problems(str(tmp_path / "study")) == []


def test_no_temporary_file_stays_after_a_failed_write(tmp_path, monkeypatch) -> None:
    def full(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        write_atomic(str(tmp_path / "x"), b"abc")
    assert os.listdir(tmp_path) == []


def test_links_out_of_the_folder_are_named_one_line_each(tmp_path) -> None:
    root = tmp_path / "study"
    (root / "trials").mkdir(parents=True)
    victim = _victim(tmp_path)
    os.symlink(victim, root / "best.sh.tmp")
    os.symlink(victim, root / "trials" / "trial-000009.parquet")
    os.symlink("trials", root / "rows")  # a link inside the folder is harmless
    problems = folder_problems(str(root))
    assert len(problems) == 2 and all("\n" not in p for p in problems)
    assert all("is a symbolic link to" in p and "outside the study folder" in p for p in problems)


@contextlib.contextmanager
def _immutable(path: str) -> Iterator[None]:
    if shutil.which("chattr") is None:
        pytest.skip("no chattr on this machine")
    done = subprocess.run(["chattr", "+i", path], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"chattr +i is not allowed here: {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", path], check=True)


def _finished(tmp_path: Any) -> tuple[Any, Any]:
    """A finished two-trial study, and its experiment with two trials more."""
    doc = twin_doc(str(tmp_path / "runs"), bench={"warmup": 1, "repeats": 1, "max_tokens": 10})
    doc["study"]["n_trials"] = 2
    exp = write_experiment(str(tmp_path), doc)
    run_study(load_config(exp), trial_fn=SimulatedTrials(), printer=lambda _l: None)
    return load_config(exp, ["study.n_trials=4"]), StudyFolder(load_config(exp).out_dir)


def _refused_before_a_launch(cfg: Any, match: str) -> None:
    sim = SimulatedTrials()
    with pytest.raises(ConfigError, match=match) as err:
        run_study(cfg, trial_fn=sim, printer=lambda _l: None)
    assert "\n" not in str(err.value) and str(err.value).startswith("output.dir: ")
    assert sim.launches == []


def test_an_immutable_journal_is_refused_before_the_first_launch(tmp_path) -> None:
    cfg, folder = _finished(tmp_path)
    with _immutable(folder.journal):
        _refused_before_a_launch(cfg, "optuna.journal cannot be written")


def test_an_unwritable_trials_folder_is_refused_before_the_first_launch(tmp_path) -> None:
    cfg, folder = _finished(tmp_path)
    with _immutable(folder.trials):
        _refused_before_a_launch(cfg, "trials cannot be written")


def test_trials_as_a_file_is_refused_before_the_first_launch(tmp_path) -> None:
    cfg, folder = _finished(tmp_path)
    shutil.rmtree(folder.trials)
    with open(folder.trials, "w") as fh:
        fh.write("x")
    _refused_before_a_launch(cfg, "trials is a file")


def test_a_trial_file_with_another_column_type_is_refused_before_the_first_launch(
    tmp_path,
) -> None:
    cfg, folder = _finished(tmp_path)
    path = folder.trial_file(1)
    table = pq.read_table(path)
    i = table.schema.get_field_index("value")
    text = pa.array([str(v) for v in table.column("value").to_pylist()])
    pq.write_table(table.set_column(i, pa.field("value", pa.string()), text), path)
    _refused_before_a_launch(cfg, "trial-000001.parquet: column 'value' holds string")


def test_a_stray_file_in_trials_is_not_read_as_a_row(tmp_path) -> None:
    cfg, folder = _finished(tmp_path)
    with open(os.path.join(folder.trials, "notes.txt"), "w") as fh:
        fh.write("my notes")
    with open(folder.trial_file(1) + ".tmp", "wb") as fh:
        fh.write(b"half a file")
    run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _l: None)
    from rayspec.store import ParquetTrialStore

    assert [r["trial"] for r in ParquetTrialStore(folder.root).trial_rows()] == [0, 1, 2, 3]
