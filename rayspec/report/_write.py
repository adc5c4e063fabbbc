"""Write ``<out>/report.md`` and ``<out>/plots/*.png`` for a study folder."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rayspec._atomic import write_atomic
from rayspec._exceptions import StoreError
from rayspec._plural import plural
from rayspec.report._load import load_study_folder
from rayspec.report._markdown import render
from rayspec.report._plots import Plot
from rayspec.report._plots import draw_plots
from rayspec.store import StudyFolder
from rayspec.store import folder_problems

if TYPE_CHECKING:
    from rayspec._config import ExperimentConfig

__all__ = ["ReportFiles", "write_report"]


@dataclass(frozen=True)
class ReportFiles:
    """What :func:`write_report` wrote.

    Attributes:
        markdown: the path of ``report.md``.
        plots: every plot, drawn (``path``) or skipped (``skipped``).
        wall_s: how long it took.
    """

    markdown: str
    plots: tuple[Plot, ...]
    wall_s: float

    @property
    def drawn(self) -> tuple[Plot, ...]:
        return tuple(p for p in self.plots if p.path)

    def describe(self) -> str:
        """One line for a terminal."""
        return (
            f"report: {self.markdown} ({plural(len(self.drawn), 'plot')} in "
            f"{StudyFolder(os.path.dirname(self.markdown)).plots}/, {self.wall_s:.1f} s)"
        )


def write_report(path: str, cfg: ExperimentConfig | None = None) -> ReportFiles:
    """Write the report of the study folder ``path``.

    Example::

        write_report("runs/eagle3-twin").describe()

    Args:
        path: the study folder (``<output.dir>/<study.name>``, the one holding ``trials/``).
        cfg: the experiment, when known: the launch command is built from it.

    Raises:
        StoreError: ``path`` is not a study folder, cannot be read, or holds a link out of it
            (or a folder the report cannot write): one line.
        OSError: the report could not be written.
    """
    t0 = time.monotonic()
    data = load_study_folder(path, cfg)
    folder = StudyFolder(path)
    problems = folder_problems(path)  # a link out of the folder, a folder it cannot write
    if problems:
        more = f" (and {plural(len(problems) - 1, 'more problem')})" if len(problems) > 1 else ""
        raise StoreError(f"{problems[0]}{more}")
    plots = tuple(draw_plots(data, folder.plots))
    markdown = folder.report_md
    write_atomic(markdown, render(data, plots, path))
    return ReportFiles(markdown, plots, time.monotonic() - t0)
