from __future__ import annotations

import math
import os

import pyarrow.parquet as pq
import pytest

from rayspec import Candidate
from rayspec import LaunchSpec
from rayspec import RequestRecord
from rayspec import SpecSettings
from rayspec import TrialResult
from rayspec.store import ParquetTrialStore
from rayspec.testing import TrialStoreTestCase

LAUNCH = LaunchSpec(
    argv=("python", "-m", "sglang.launch_server", "--port", "30000"),
    env=(("NCCL_PROTO", "LL"),),
    host="127.0.0.1",
    port=30000,
    log_path="/tmp/x.log",
    startup_timeout_s=10,
    engine="twin",
    unset_env=("NCCL_ALGO",),
)


def _req(run: int, tok: int = 100) -> RequestRecord:
    return RequestRecord(
        scenario="single", run=run, index=0, concurrency=1, prompt_tokens=20,
        completion_tokens=tok, ttft_ms=50.0, e2e_ms=1000.0, itl_ms=(10.0,) * (tok - 1),
        start_unix_s=1.0, spec_verify_ct=50, accept_length=tok / 50,
    )  # fmt: skip


def _result(n: int, state: str = "COMPLETE", **metrics: float) -> TrialResult:
    return TrialResult(
        trial=n, state=state, value=metrics.get("tok_s_mean"),
        candidate=Candidate(
            nccl_env=(("NCCL_PROTO", "LL"),), spec=SpecSettings("EAGLE3", 2, 1, 3)
        ),
        launch=LAUNCH, metrics=metrics, requests=(_req(-1), _req(0), _req(1)),
        start_unix_s=10.0, end_unix_s=12.5,
        failure=None if state == "COMPLETE" else "out_of_memory",
    )  # fmt: skip


def test_rows_round_trip_with_columns_that_differ(tmp_path) -> None:
    store = ParquetTrialStore(str(tmp_path))
    store.append_trial(_result(0, tok_s_mean=90.0, tok_s_peak=92.0))
    store.append_trial(_result(1, "FAIL"))  # no metrics at all
    store.append_trial(_result(2, tok_s_mean=95.5, tok_s_peak=97.0, accept_length=1.9))
    rows = {r["trial"]: r for r in store.load_trials().to_pylist()}
    assert set(rows) == {0, 1, 2}
    assert rows[2]["accept_length"] == 1.9 and rows[0]["accept_length"] is None
    assert rows[1]["state"] == "FAIL" and rows[1]["failure"] == "out_of_memory"
    assert rows[0]["env"] == '{"NCCL_PROTO": "LL"}'
    assert rows[0]["duration_s"] == 2.5
    assert rows[0]["spec_num_draft_tokens"] == 3.0
    reqs = store.load_requests()
    assert reqs.num_rows == 9
    assert sorted(set(reqs.column("run").to_pylist())) == [-1, 0, 1]
    first = reqs.to_pylist()[0]
    assert math.isclose(first["accept_length"], 2.0) and len(first["itl_ms"]) == 99


def test_rewriting_a_trial_keeps_it_exactly_once(tmp_path) -> None:
    store = ParquetTrialStore(str(tmp_path))
    store.append_trial(_result(4, "FAIL"))
    store.append_trial(_result(4, tok_s_mean=80.0))
    table = store.load_trials()
    assert table.num_rows == 1 and table.column("state").to_pylist() == ["COMPLETE"]
    assert store.trial_numbers() == {4}


def test_leftover_temp_files_are_ignored(tmp_path) -> None:
    store = ParquetTrialStore(str(tmp_path))
    store.append_trial(_result(0, tok_s_mean=1.0))
    with open(os.path.join(store.trials_dir, ".trial-000001.parquet.tmp"), "wb") as fh:
        fh.write(b"PAR1 half a file")
    assert store.load_trials().num_rows == 1
    # Each file is a complete Parquet file on its own.
    assert pq.read_table(os.path.join(store.trials_dir, "trial-000000.parquet")).num_rows == 1


def test_empty_store(tmp_path) -> None:
    store = ParquetTrialStore(str(tmp_path / "none"))
    assert store.load_trials().num_rows == 0
    assert store.load_requests().num_rows == 0
    assert store.trial_numbers() == set()


class TestParquetStoreContract(TrialStoreTestCase):
    @pytest.fixture
    def store(self, tmp_path) -> ParquetTrialStore:
        return ParquetTrialStore(str(tmp_path))
