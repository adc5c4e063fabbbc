"""The study at a glance: ``report.md`` with the field-style table and PNG plots.

``python -m rayspec.report runs/eagle3-twin`` (a study folder) writes
``runs/eagle3-twin/report.md`` and ``runs/eagle3-twin/plots/*.png``; ``python -m rayspec.tune``
writes them at the end of every study.
"""

from __future__ import annotations

from rayspec.report._write import ReportFiles
from rayspec.report._write import write_report

__all__ = ["ReportFiles", "write_report"]
