"""Chaos: symbolic links planted at every file a study writes, before it starts and while it runs.

The names are generated, not listed by hand: a reference study (the twin's model in process,
the CLI's end writes: report, ``best.*``) is run once and its folder walked; to every file found
and every name :class:`~rayspec.store.StudyFolder` declares are added the temporary names the
writers used (``X.tmp``, ``.X.tmp``). Each planted link points at its own file (or folder)
outside the study, whose content and mode are checked afterwards.

- Planted before the study starts (a new study and a finished one being resumed): the study is
  refused with one line per link, naming it, and nothing outside changes.
- Planted while it runs (at the second trial, at every name not written yet): the study ends
  normally, every file it wrote is a file of its own, and nothing outside changes.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from typing import Any

import pytest

from rayspec._config import ExperimentConfig
from rayspec._config import load_config
from rayspec._exceptions import ConfigError
from rayspec.results import write_best
from rayspec.store import StudyFolder
from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study
from tests.helpers import REPO
from tests.helpers import TWIN_EXPERIMENT


def _cfg(out: str, restarts: int = 3) -> ExperimentConfig:
    return load_config(TWIN_EXPERIMENT, [
        f"output.dir={out}", f"study.max_restarts={restarts}", "bench.repeats=2",
        "bench.max_tokens=40", "bench.prompts=mixed", "cluster.include_dashboard=false",
    ])  # fmt: skip


def _study(cfg: ExperimentConfig, trial_fn: Any = None) -> list[str]:
    """As the CLI runs it: the study, its report, then best.yaml / best.sh / best-twin.sh."""
    lines: list[str] = []
    outcome = run_study(
        cfg, trial_fn=trial_fn or SimulatedTrials(), printer=lines.append, write_report=True
    )
    write_best(cfg, outcome.report)
    return lines


def _written(root: str) -> tuple[list[str], list[str]]:
    """(files, folders) under ``root``, relative, the study's lock helpers left out."""
    files, folders = [], []
    for here, dirs, names in os.walk(root):
        rel = os.path.relpath(here, root)
        folders += [os.path.normpath(os.path.join(rel, d)) for d in dirs]
        files += [os.path.normpath(os.path.join(rel, n)) for n in names]
    return sorted(files), sorted(folders)


@pytest.fixture(scope="module")
def names(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Every name a study writes (generated from a reference run and StudyFolder)."""
    out = str(tmp_path_factory.mktemp("reference"))
    cfg = _cfg(out)
    _study(cfg)
    files, folders = _written(cfg.out_dir)
    declared = StudyFolder(cfg.out_dir)
    files += [os.path.relpath(p, cfg.out_dir) for p in declared.files()]
    folders += [os.path.relpath(p, cfg.out_dir) for p in declared.folders()]
    files = sorted(set(files))
    temps = sorted(
        {os.path.join(os.path.dirname(f), t) for f in files
         for t in (os.path.basename(f) + ".tmp", "." + os.path.basename(f) + ".tmp")}
    )  # fmt: skip
    assert {"best.sh", "best.yaml", "best-twin.sh", "report.md", "optuna.journal"} <= set(files)
    assert {"trials", "requests", "categories", "plots"} <= set(folders)
    assert any(f.startswith("categories" + os.sep) for f in files)
    return {"files": files, "temps": temps, "folders": sorted(set(folders))}


class Victims:
    """The files and folders outside the study that planted links point at."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.made: dict[str, tuple[bytes, int]] = {}
        os.makedirs(where, exist_ok=True)

    def file(self) -> str:
        path = os.path.join(self.where, f"victim-{len(self.made)}")
        body = f"outside file {len(self.made)}\n".encode()
        with open(path, "wb") as fh:
            fh.write(body)
        os.chmod(path, 0o600)
        self.made[path] = (body, 0o600)
        return path

    def folder(self) -> str:
        path = os.path.join(self.where, f"victim-dir-{len(self.made)}")
        os.makedirs(path)
        self.made[path] = (b"", 0)
        return path

    def untouched(self) -> None:
        for path, (body, mode) in self.made.items():
            if os.path.isdir(path):
                assert os.listdir(path) == [], f"{path} was written into"
                continue
            with open(path, "rb") as fh:
                assert fh.read() == body, f"{path} was overwritten"
            assert stat.S_IMODE(os.stat(path).st_mode) == mode, f"{path} changed mode"
        extra = set(os.listdir(self.where)) - {os.path.basename(p) for p in self.made}
        assert not extra, f"files appeared outside the study: {sorted(extra)}"


def _plant(root: str, rel: str, target: str) -> bool:
    path = os.path.join(root, rel)
    if os.path.lexists(path) or not os.path.isdir(os.path.dirname(path)):
        return False
    if os.path.islink(os.path.dirname(path)):
        return False
    os.symlink(target, path)
    return True


def _plant_all(root: str, names: dict[str, list[str]], victims: Victims) -> list[str]:
    planted = []
    for rel in names["folders"]:
        if _plant(root, rel, victims.folder()):
            planted.append(rel)
    for rel in names["files"] + names["temps"]:
        if _plant(root, rel, victims.file()):
            planted.append(rel)
    return planted


def _refused(cfg: ExperimentConfig, planted: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        _study(cfg)
    lines = str(err.value).split("\nerror: ")
    for rel in planted:
        path = os.path.join(cfg.out_dir, rel)
        said = f"output.dir: {path} is a symbolic link"
        assert sum(line.startswith(said) for line in lines) == 1
    assert len(lines) == len(planted)  # one line per link, nothing else


def test_links_planted_before_a_new_study_are_refused(tmp_path, names) -> None:
    cfg = _cfg(str(tmp_path / "runs"))
    os.makedirs(cfg.out_dir)
    victims = Victims(str(tmp_path / "outside"))
    planted = [rel for rel in names["files"] + names["temps"] if os.sep not in rel]
    for rel in planted:
        _plant(cfg.out_dir, rel, victims.file())
    folders = [rel for rel in names["folders"] if os.sep not in rel]
    for rel in folders:
        _plant(cfg.out_dir, rel, victims.folder())
    _refused(cfg, planted + folders)
    victims.untouched()


def test_links_planted_in_a_finished_study_are_refused_on_resume(tmp_path, names) -> None:
    cfg = _cfg(str(tmp_path / "runs"))
    _study(cfg)
    victims = Victims(str(tmp_path / "outside"))
    planted = _plant_all(cfg.out_dir, names, victims)
    assert len(planted) > 20
    _refused(_cfg(str(tmp_path / "runs"), restarts=5), planted)
    victims.untouched()


def test_links_planted_while_the_study_runs_are_never_followed(tmp_path, names) -> None:
    cfg = _cfg(str(tmp_path / "runs"))
    victims = Victims(str(tmp_path / "outside"))
    planted: list[str] = []
    sim = SimulatedTrials()

    def trial_fn(cfg_: ExperimentConfig, number: int, candidate: Any, **kw: Any) -> Any:
        if number == 1:  # trial 0's files written, the rest of the study still to come
            planted.extend(_plant_all(cfg.out_dir, names, victims))
        return sim(cfg_, number, candidate, **kw)

    lines = _study(cfg, trial_fn)
    assert len(planted) > 20
    victims.untouched()
    rows = [rel for rel in planted if rel in names["files"]
            and rel.startswith(("trials" + os.sep, "requests" + os.sep))]  # fmt: skip
    assert rows  # the later trials' files: written over the links, as files of the study's
    for rel in [*rows, "best.sh", "best.yaml", "best-twin.sh"]:
        path = os.path.join(cfg.out_dir, rel)
        assert os.path.isfile(path) and not os.path.islink(path), rel
    # The report refuses a folder holding links out of it, in one line, and the study goes on.
    (warning,) = [line for line in lines if "report not written" in line]
    assert "is a symbolic link to" in warning and "\n" not in warning
    assert stat.S_IMODE(os.stat(os.path.join(cfg.out_dir, "best.sh")).st_mode) == 0o755


def test_the_cli_refuses_a_planted_link_in_one_line(tmp_path) -> None:
    out = tmp_path / "runs"
    victim = tmp_path / "victim"
    victim.write_text("keep\n")
    (out / "eagle3-twin").mkdir(parents=True)
    os.symlink(victim, out / "eagle3-twin" / "best.sh.tmp")
    done = subprocess.run(
        [sys.executable, "-m", "rayspec.tune", TWIN_EXPERIMENT, f"output.dir={out}",
         "cluster.include_dashboard=false"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: output.dir: ") and "best.sh.tmp is a symbolic link" in line
    assert victim.read_text() == "keep\n"
    shutil.rmtree(out)
