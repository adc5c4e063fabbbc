"""One schema for every trial and request file: readers that take the first file's schema
(``pq.read_table(dir)``, DuckDB) see every column."""

from __future__ import annotations

import logging

import pyarrow.parquet as pq

from rayspec import Candidate
from rayspec import RequestRecord
from rayspec import SpecSettings
from rayspec import TrialRecord
from rayspec import TrialResult
from rayspec._types import TrialState
from rayspec.bench import summarize
from rayspec.store import REQUEST_SCHEMA
from rayspec.store import TRIAL_METRICS
from rayspec.store import ParquetTrialStore
from rayspec.store import trial_schema


def _req(run: int) -> RequestRecord:
    return RequestRecord(
        scenario="single", run=run, index=0, concurrency=1, prompt_tokens=20,
        completion_tokens=100, ttft_ms=50.0, e2e_ms=1000.0, itl_ms=(10.0,) * 99,
        start_unix_s=1.0, spec_verify_ct=50, accept_length=2.0,
    )  # fmt: skip


def _result(n: int, metrics: dict[str, float], state: str = "COMPLETE") -> TrialResult:
    spec = SpecSettings("EAGLE3", 2, 1, 3) if n else None
    return TrialResult(
        trial=n, state=TrialState(state), value=metrics.get("tok_s_mean"),
        candidate=Candidate(spec=spec), launch=None, metrics=metrics,
        requests=(_req(0), _req(1)) if state == "COMPLETE" else (), start_unix_s=1.0,
        end_unix_s=2.0, failure=None if state == "COMPLETE" else "out_of_memory",
    )  # fmt: skip


def test_a_baseline_row_and_a_later_row_read_whole_with_pq_read_table(tmp_path) -> None:
    store = ParquetTrialStore(str(tmp_path), scenarios=["c8"])
    # The baseline: no comparison columns yet (nothing to compare it with).
    store.append_trial(TrialRecord(_result(0, {"tok_s_mean": 60.0, "runs": 3.0}), role="baseline"))
    later = {"tok_s_mean": 90.0, "accept_length": 1.9, "vs_baseline_ratio": 1.5,
             "vs_baseline_significant": 1.0, "vs_incumbent_p": 0.01, "incumbent_trial": 0.0,
             "c8__tok_s_mean": 300.0}  # fmt: skip
    store.append_trial(_result(1, later))
    store.append_trial(_result(2, {}, state="FAIL"))

    table = pq.read_table(store.trials_dir)  # the first file's schema, as DuckDB reads it
    assert table.schema.names == trial_schema(["c8"]).names
    for column in ("vs_baseline_ratio", "vs_incumbent_p", "incumbent_trial", "c8__tok_s_mean"):
        assert column in table.column_names
    rows = {r["trial"]: r for r in table.to_pylist()}
    assert rows[1]["vs_baseline_ratio"] == 1.5 and rows[1]["c8__tok_s_mean"] == 300.0
    assert rows[0]["vs_baseline_ratio"] is None and rows[0]["role"] == "baseline"
    assert rows[2]["tok_s_mean"] is None and rows[2]["failure"] == "out_of_memory"
    # The store's own reader agrees.
    assert store.load_trials().schema.names == table.schema.names

    requests = pq.read_table(store.requests_dir)
    assert requests.schema.names == REQUEST_SCHEMA.names and requests.num_rows == 4


def test_every_summary_metric_is_declared() -> None:
    assert set(summarize([])) <= set(TRIAL_METRICS)
    names = trial_schema(["c8"]).names
    assert len(names) == len(set(names))
    assert {f"c8__{k}" for k in summarize([])} <= set(names)


def test_an_undeclared_metric_is_kept_with_a_warning(tmp_path, caplog) -> None:
    store = ParquetTrialStore(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="rayspec.store._parquet"):
        store.append_trial(_result(0, {"tok_s_mean": 60.0, "brand_new_metric": 1.0}))
    assert store.load_trials().to_pylist()[0]["brand_new_metric"] == 1.0
    assert "brand_new_metric" in caplog.text
