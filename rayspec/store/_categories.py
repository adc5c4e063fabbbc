"""Per-category figures as a long table: one row per (trial, prompt category).

A prompt set may have tens of thousands of categories. Stored as columns of the trial row (as
rayspec did before: ``category__<cat>__<metric>``) every trial file carried three columns per
category of the whole set, and 20,000 categories made a 16 MB row of 60,003 columns that took
the driver to 19.7 GB. So a trial's figures per category are rows of their own file,
``categories/trial-NNNNNN.parquet`` (:data:`CATEGORY_SCHEMA`), holding only the categories the
trial's requests reached; the trial row holds none.

A trial file written with per-category columns still reads: :func:`wide_rows` turns its
``category__*`` columns into the same long rows, one file and a few thousand columns at a time,
and the trial reader leaves those columns out of the trial rows.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from rayspec._types import CATEGORY_METRICS
from rayspec.store._folder import StudyFolder

__all__ = [
    "CATEGORY_SCHEMA",
    "category_table",
    "is_category_column",
    "read_categories",
    "split_categories",
    "wide_rows",
]

_PREFIX = "category__"

CATEGORY_SCHEMA = pa.schema(
    [
        ("trial", pa.int64()),
        ("category", pa.string()),
        *((m, pa.float64()) for m in CATEGORY_METRICS),
    ]
)
"""``categories/trial-NNNNNN.parquet``: one row per category the trial's objective scenario
reached (``bench.category_metrics``: measured requests, tok/s, accept length)."""


def _parse(key: str) -> tuple[str, str] | None:
    """(category, metric) of a ``category__<cat>__<metric>`` key, else None."""
    if not key.startswith(_PREFIX):
        return None
    cat, sep, metric = key[len(_PREFIX) :].rpartition("__")
    if not sep or not cat or metric not in CATEGORY_METRICS:
        return None
    return cat, metric


def is_category_column(name: str) -> bool:
    """Whether a trial column (or metric key) is a per-category figure."""
    return _parse(name) is not None


def split_categories(
    metrics: Mapping[str, float],
) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """A trial's metrics without the per-category ones, and those as category -> figures."""
    plain: dict[str, float] = {}
    by_cat: dict[str, dict[str, float]] = {}
    for key, value in metrics.items():
        parsed = _parse(key)
        if parsed is None:
            plain[key] = value
        else:
            by_cat.setdefault(parsed[0], {})[parsed[1]] = value
    return plain, by_cat


def category_table(trial: int, by_cat: Mapping[str, Mapping[str, float]]) -> pa.Table:
    """One trial's long rows (categories sorted), in :data:`CATEGORY_SCHEMA`."""
    cats = sorted(by_cat)
    columns: dict[str, list[Any]] = {"trial": [trial] * len(cats), "category": cats}
    for m in CATEGORY_METRICS:
        columns[m] = [_float(by_cat[c].get(m)) for c in cats]
    return pa.Table.from_pydict(columns, schema=CATEGORY_SCHEMA)


def _float(value: float | None) -> float | None:
    return None if value is None else float(value)


def read_categories(folder: str, trials: Collection[int] | None = None) -> list[dict[str, Any]]:
    """The long rows under ``folder`` (``categories/``), of ``trials`` only when given."""
    if not os.path.isdir(folder):
        return []
    names = sorted(
        name
        for name in os.listdir(folder)
        if (n := StudyFolder.trial_number(name)) is not None and (trials is None or n in trials)
    )
    if not names:
        return []
    dataset = ds.dataset(
        [os.path.join(folder, n) for n in names], schema=CATEGORY_SCHEMA, format="parquet"
    )
    rows: list[dict[str, Any]] = dataset.to_table().to_pylist()
    return rows


def wide_rows(path: str, batch: int = 3000) -> list[dict[str, Any]]:
    """The long rows of a trial file written with per-category columns (none without them).

    Reads the footer once and the category columns ``batch`` at a time, so a file of 60,003
    columns is read in bounded memory."""
    with pq.ParquetFile(path) as pf:
        names = pf.schema_arrow.names
        wanted = [name for name in names if is_category_column(name)]
        if not wanted or "trial" not in names:
            return []
        trials = [int(t) for t in pf.read(columns=["trial"]).column("trial").to_pylist()]
        by_cat: list[dict[str, dict[str, Any]]] = [{} for _ in trials]
        for start in range(0, len(wanted), batch):
            part = pf.read(columns=wanted[start : start + batch])
            for key in part.column_names:
                parsed = _parse(key)
                if parsed is None:
                    continue
                for i, value in enumerate(part.column(key).to_pylist()):
                    if value is not None:
                        by_cat[i].setdefault(parsed[0], {})[parsed[1]] = value
    out: list[dict[str, Any]] = []
    for trial, cats in zip(trials, by_cat, strict=True):
        for cat in sorted(cats):
            entry: dict[str, Any] = {"trial": trial, "category": cat}
            entry.update({m: cats[cat].get(m) for m in CATEGORY_METRICS})
            out.append(entry)
    return out
