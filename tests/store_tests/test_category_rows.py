"""Per-category figures are rows of ``categories/``, not columns of the trial row: the trial
file's width does not grow with the prompt set, and files written with the old columns read."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq

from rayspec._types import category_key
from rayspec.store import ParquetTrialStore
from rayspec.store._parquet import trial_row
from tests.store_tests.test_parquet import _result


def _figures(cats: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for i in range(cats):
        out[category_key(f"cat-{i}", "requests")] = float(i % 3 + 1)
        out[category_key(f"cat-{i}", "tok_s")] = 50.0 + i
        out[category_key(f"cat-{i}", "accept_length")] = 2.0
    return out


def test_a_trial_of_many_categories_is_as_wide_as_one_of_two(tmp_path) -> None:
    store = ParquetTrialStore(str(tmp_path))
    store.append_trial(_result(0, tok_s_mean=90.0, **_figures(2)))
    store.append_trial(_result(1, tok_s_mean=91.0, **_figures(5000)))
    narrow = pq.read_schema(store.folder.trial_file(0)).names
    wide = pq.read_schema(store.folder.trial_file(1)).names
    assert narrow == wide and not [n for n in wide if n.startswith("category__")]
    assert pq.read_table(store.folder.category_file(1)).num_rows == 5000
    rows = store.category_rows({1})
    assert len(rows) == 5000 and {r["trial"] for r in rows} == {1}
    first = next(r for r in rows if r["category"] == "cat-4")
    assert (first["requests"], first["tok_s"], first["accept_length"]) == (2.0, 54.0, 2.0)
    assert len(store.category_rows()) == 5002


def test_a_category_name_of_any_text_round_trips(tmp_path) -> None:
    names = ["a\nb", "x|y", "<b>bold</b>", "z" * 3000, "under__score", "é"]
    metrics = {category_key(n, "requests"): 1.0 for n in names}
    store = ParquetTrialStore(str(tmp_path))
    store.append_trial(_result(0, tok_s_mean=90.0, **metrics))
    assert sorted(r["category"] for r in store.category_rows()) == sorted(names)


def test_an_old_trial_file_with_category_columns_still_reads(tmp_path) -> None:
    store = ParquetTrialStore(str(tmp_path))
    store.append_trial(_result(0, tok_s_mean=90.0, **_figures(3)))  # the new layout
    # Trial 1 as rayspec wrote it before categories/: the figures as columns of the row.
    row = trial_row(_result(1, tok_s_mean=91.0))
    for key, value in _figures(4).items():
        row = row.append_column(pa.field(key, pa.float64()), pa.array([value]))
    row = row.append_column(
        pa.field(category_key("cat-9", "tok_s"), pa.float64()), pa.array([None], pa.float64())
    )
    os.makedirs(store.trials_dir, exist_ok=True)
    pq.write_table(row, store.folder.trial_file(1))

    rows = store.trial_rows()
    assert [r["trial"] for r in rows] == [0, 1]
    assert not [k for r in rows for k in r if k.startswith("category__")]
    assert rows[1]["tok_s_mean"] == 91.0
    old = store.category_rows({1})
    assert [r["category"] for r in old] == ["cat-0", "cat-1", "cat-2", "cat-3"]  # no null one
    assert old[1] == {"trial": 1, "category": "cat-1", "requests": 2.0, "tok_s": 51.0,
                      "accept_length": 2.0}  # fmt: skip
    assert len(store.category_rows()) == 7


def test_an_unreadable_category_file_is_set_aside(tmp_path) -> None:
    store = ParquetTrialStore(str(tmp_path))
    store.append_trial(_result(0, tok_s_mean=90.0, **_figures(3)))
    with open(store.folder.category_file(0), "wb") as fh:
        fh.write(b"not parquet")
    (said,) = store.set_aside_damaged()
    assert "categories" in said and store.category_rows() == []
