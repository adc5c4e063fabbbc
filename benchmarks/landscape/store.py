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

META_KEY = b"rayspec_landscape"
SCHEMA = pa.schema(
    [
        ("drafter", pa.string()),
        ("mode", pa.string()),  # "off" | "EAGLE3"
        ("num_steps", pa.int32()),  # null when off
        ("eagle_topk", pa.int32()),
        ("num_draft_tokens", pa.int32()),
        ("setting", pa.string()),  # the Candidate's label()
        ("start", pa.int32()),  # 0-based per drafter and setting
        ("run", pa.int32()),  # -1: warm-up
        ("index", pa.int32()),
        ("tok_s", pa.float64()),  # the run's run_tok_s
        ("prompt_tokens", pa.int32()),
        ("completion_tokens", pa.int32()),
        ("ttft_ms", pa.float64()),
        ("e2e_ms", pa.float64()),
        ("itl_ms", pa.list_(pa.float64())),
        ("accept_length", pa.float64()),  # null when off
        ("spec_verify_ct", pa.int32()),
        ("accept_histogram", pa.list_(pa.int64())),
        ("output_ids", pa.list_(pa.int64())),
        ("startup_s", pa.float64()),  # launch to ready of that start
        ("load_1m", pa.float64()),  # os.getloadavg()[0] at the start
        ("started_unix_s", pa.float64()),
    ]
)
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
