"""A recorded landscape: every request of a sweep of server starts, one Parquet file per drafter.

A landscape is what a real engine did for each setting of a space, started several times
(``benchmarks/landscapes/cpu-<drafter>.parquet``): one row per request, with the start and run
it belongs to, so a replay (:class:`rayspec.testing.ReplayedTrials`) can serve a study the
recorded starts instead of a model. Columns (:data:`LANDSCAPE_SCHEMA`): ``drafter``, ``mode``
(``"off"`` or ``"EAGLE3"``), ``num_steps``/``eagle_topk``/``num_draft_tokens`` (null when off),
``setting`` (the configuration's ``Candidate.label()``), ``start`` (0-based per drafter and
setting), ``run`` (-1 for a warm-up request), ``index``, ``tok_s`` (the run's throughput, the
same on each of its requests), the request's ``prompt_tokens``, ``completion_tokens``,
``ttft_ms``, ``e2e_ms``, ``itl_ms``, ``accept_length``, ``spec_verify_ct``, ``accept_histogram``
(null without speculation) and ``output_ids``, and the start's ``startup_s``, ``load_1m`` (the
machine's load while it ran) and ``started_unix_s``. The file's key-value metadata
``rayspec_landscape`` is a JSON object (versions, recipe, ``max_tokens``, the command that
re-records it).

Example::

    land = read_landscape("benchmarks/landscapes/cpu-d0.parquet")
    {r.setting for r in land.rows}
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rayspec._exceptions import StoreError

__all__ = [
    "LANDSCAPE_META_KEY",
    "LANDSCAPE_SCHEMA",
    "Landscape",
    "LandscapeRow",
    "read_landscape",
    "write_landscape",
]

LANDSCAPE_META_KEY = "rayspec_landscape"
LANDSCAPE_SCHEMA = pa.schema(
    [
        ("drafter", pa.string()),
        ("mode", pa.string()),
        ("num_steps", pa.int32()),
        ("eagle_topk", pa.int32()),
        ("num_draft_tokens", pa.int32()),
        ("setting", pa.string()),
        ("start", pa.int32()),
        ("run", pa.int32()),
        ("index", pa.int32()),
        ("tok_s", pa.float64()),
        ("prompt_tokens", pa.int32()),
        ("completion_tokens", pa.int32()),
        ("ttft_ms", pa.float64()),
        ("e2e_ms", pa.float64()),
        ("itl_ms", pa.list_(pa.float64())),
        ("accept_length", pa.float64()),
        ("spec_verify_ct", pa.int32()),
        ("accept_histogram", pa.list_(pa.int64())),
        ("output_ids", pa.list_(pa.int64())),
        ("startup_s", pa.float64()),
        ("load_1m", pa.float64()),
        ("started_unix_s", pa.float64()),
    ]
)
# Columns that may be null: the speculative ones without speculation.
_NULLABLE = frozenset(
    {"num_steps", "eagle_topk", "num_draft_tokens", "accept_length", "spec_verify_ct",
     "accept_histogram"}
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class LandscapeRow:
    """One recorded request (the columns of :data:`LANDSCAPE_SCHEMA`, lists as tuples)."""

    drafter: str
    mode: str
    num_steps: int | None
    eagle_topk: int | None
    num_draft_tokens: int | None
    setting: str
    start: int
    run: int
    index: int
    tok_s: float
    prompt_tokens: int
    completion_tokens: int
    ttft_ms: float
    e2e_ms: float
    itl_ms: tuple[float, ...]
    accept_length: float | None
    spec_verify_ct: int | None
    accept_histogram: tuple[int, ...] | None
    output_ids: tuple[int, ...]
    startup_s: float
    load_1m: float
    started_unix_s: float


@dataclasses.dataclass(frozen=True)
class Landscape:
    """A landscape file read whole: its requests in file order and its metadata."""

    path: str
    rows: tuple[LandscapeRow, ...]
    meta: Mapping[str, Any]

    @property
    def drafters(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.drafter for r in self.rows))

    @property
    def settings(self) -> tuple[str, ...]:
        """The recorded settings (labels), in file order."""
        return tuple(dict.fromkeys(r.setting for r in self.rows))


def read_landscape(path: str) -> Landscape:
    """Read a landscape file, checking every column of :data:`LANDSCAPE_SCHEMA`.

    Raises:
        StoreError: the file is missing or unreadable, a column is missing or of another type,
            a non-nullable value is null, or the metadata is not a JSON object (the message
            names the file and the column).
    """
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise StoreError(f"landscape {path}: cannot read it: {exc}") from exc
    for field in LANDSCAPE_SCHEMA:
        if field.name not in table.column_names:
            raise StoreError(f"landscape {path}: column {field.name!r} is missing")
        got = table.schema.field(field.name).type
        if not _compatible(got, field.type):
            raise StoreError(
                f"landscape {path}: column {field.name!r} is {got}, expected {field.type}"
            )
        if field.name not in _NULLABLE and table.column(field.name).null_count:
            raise StoreError(f"landscape {path}: column {field.name!r} holds nulls")
    raw = (table.schema.metadata or {}).get(LANDSCAPE_META_KEY.encode())
    try:
        meta = json.loads(raw) if raw is not None else {}
    except ValueError as exc:
        raise StoreError(f"landscape {path}: metadata {LANDSCAPE_META_KEY!r}: {exc}") from exc
    if not isinstance(meta, dict):
        raise StoreError(f"landscape {path}: metadata {LANDSCAPE_META_KEY!r} is not an object")
    names = [f.name for f in LANDSCAPE_SCHEMA]
    columns = [table.column(n).to_pylist() for n in names]
    rows = tuple(
        LandscapeRow(**{n: _tuple(v) for n, v in zip(names, values, strict=True)})
        for values in zip(*columns, strict=True)
    )
    return Landscape(path=os.fspath(path), rows=rows, meta=meta)


def write_landscape(
    path: str, rows: Sequence[LandscapeRow], meta: Mapping[str, Any] | None = None
) -> None:
    """Write ``rows`` as a landscape file (atomically: a temporary file, then a rename)."""
    names = [f.name for f in LANDSCAPE_SCHEMA]
    data = {n: [_listed(getattr(r, n)) for r in rows] for n in names}
    schema = LANDSCAPE_SCHEMA.with_metadata(
        {LANDSCAPE_META_KEY: json.dumps(dict(meta or {}), sort_keys=True)}
    )
    table = pa.table(data, schema=schema)
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except (OSError, pa.ArrowException) as exc:
        raise StoreError(f"landscape {path}: cannot write it: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _compatible(got: pa.DataType, want: pa.DataType) -> bool:
    """Integers of any width read as integers, floats as floats, lists by their items."""
    if pa.types.is_list(want) or pa.types.is_large_list(want):
        return (pa.types.is_list(got) or pa.types.is_large_list(got)) and _compatible(
            got.value_type, want.value_type
        )
    if pa.types.is_integer(want):
        return bool(pa.types.is_integer(got) or pa.types.is_null(got))
    if pa.types.is_floating(want):
        return bool(pa.types.is_floating(got) or pa.types.is_integer(got) or pa.types.is_null(got))
    if pa.types.is_string(want):
        return bool(pa.types.is_string(got) or pa.types.is_large_string(got))
    return bool(got == want)


def _tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _listed(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
