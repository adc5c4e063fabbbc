"""The recorded landscape's file: ``benchmarks/landscapes/cpu-<drafter>.parquet``.

One row per request (warm-up included, ``run == -1``), the columns of :data:`SCHEMA`; the
no-speculation starts are in every drafter's file (the same rows, ``drafter`` the file's).
Key-value metadata ``rayspec_landscape``: a JSON object (versions, models, flags, protocol,
machine, the command that re-records it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rayspec.store import LANDSCAPE_META_KEY
from rayspec.store import LANDSCAPE_SCHEMA

# One format: the store's (rayspec.store.read_landscape checks it; ReplayedTrials reads it).
META_KEY = LANDSCAPE_META_KEY.encode()
SCHEMA = LANDSCAPE_SCHEMA
COLUMNS = tuple(SCHEMA.names)


def landscape_path(folder: Path, drafter: str) -> Path:
    return folder / f"cpu-{drafter}.parquet"


def read_landscape(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows and the metadata of a landscape file (none of either when it is missing)."""
    if not path.is_file():
        return [], {}
    table = pq.read_table(path)
    raw = (table.schema.metadata or {}).get(META_KEY)
    meta = json.loads(raw) if raw else {}
    return table.to_pylist(), meta


def write_landscape(
    path: Path, rows: Iterable[Mapping[str, Any]], meta: Mapping[str, Any]
) -> None:
    """Write atomically (a temporary file renamed over ``path``), rows in a stable order."""
    ordered = sorted(
        rows,
        key=lambda r: (r["mode"] != "off", r["setting"], r["start"], r["run"], r["index"]),
    )
    table = pa.Table.from_pylist([{k: r.get(k) for k in COLUMNS} for r in ordered], SCHEMA)
    table = table.replace_schema_metadata({META_KEY: json.dumps(dict(meta), sort_keys=True)})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)


def starts_done(rows: Iterable[Mapping[str, Any]]) -> set[tuple[str, int]]:
    """``(setting, start)`` of every start the rows hold."""
    return {(r["setting"], int(r["start"])) for r in rows}
