"""What a study saves for its pick to be rebuilt from the folder: the search space it declared
(``search_space.json``) and the NCCL screen's classes (``nccl_screen.json``)."""

from __future__ import annotations

import os

from rayspec._atomic import write_atomic
from rayspec._exceptions import ConfigError
from rayspec._exceptions import StoreError
from rayspec.screen import ScreenReport
from rayspec.search import Equivalence
from rayspec.search import SearchSpace
from rayspec.store import StudyFolder

__all__ = ["load_equivalence", "load_space", "save_space", "write_text"]


def write_text(path: str, text: str, mode: int = 0o644) -> None:
    """Write ``text`` to ``path`` atomically (a reader sees the old file or the new one), never
    through a link planted at its name (:func:`rayspec._atomic.write_atomic`)."""
    write_atomic(path, text, mode=mode)


def save_space(out_dir: str, space: SearchSpace) -> str:
    """Write ``<out>/search_space.json``: the report reads candidates back through it."""
    os.makedirs(out_dir, exist_ok=True)
    path = StudyFolder(out_dir).search_space
    write_text(path, space.to_json() + "\n")
    return path


def load_space(out_dir: str) -> SearchSpace | None:
    """The space :func:`save_space` wrote (None when the folder has none).

    Raises:
        StoreError: the file is there but is not a search space.
    """
    path = StudyFolder(out_dir).search_space
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc}") from exc
    try:
        return SearchSpace.from_json(text)
    except ConfigError as exc:
        raise StoreError(f"{path}: {exc}") from exc


def load_equivalence(out_dir: str) -> Equivalence | None:
    """The saved screen's classes of ``<out_dir>/nccl_screen.json`` (None without a screen):
    a report rebuilt from a study folder pools equivalent NCCL sets as the study did."""
    try:
        with open(StudyFolder(out_dir).nccl_screen, encoding="utf-8") as fh:
            report, _ = ScreenReport.from_json(fh.read())
    except (OSError, ValueError):
        return None
    return report.representative
