"""Request rows read back typed: a request's failure is a FailureReason, never parsed from
its message."""

from __future__ import annotations

from rayspec import Candidate
from rayspec import FailureReason
from rayspec import LaunchSpec
from rayspec import RequestRecord
from rayspec import TrialResult
from rayspec._types import TrialState
from rayspec.store import ParquetTrialStore
from rayspec.store import request_record

LAUNCH = LaunchSpec(
    argv=("python", "-m", "sglang.launch_server", "--port", "30000"), env=(("NCCL_PROTO", "LL"),),
    host="127.0.0.1", port=30000, log_path="/tmp/x.log", startup_timeout_s=10, engine="twin",
    unset_env=("NCCL_ALGO",),
)  # fmt: skip


def _request(run: int, failure: FailureReason | None = None) -> RequestRecord:
    return RequestRecord(
        scenario="single", run=run, index=0, concurrency=1, prompt_tokens=20,
        completion_tokens=100, ttft_ms=50.0, e2e_ms=1000.0, itl_ms=(10.0,) * 99,
        start_unix_s=1.0, spec_verify_ct=50, accept_length=2.0, output_ids=(1, 2, 3),
        error="connection lost after 3 tokens" if failure else None, failure=failure,
    )  # fmt: skip


def _result(n: int) -> TrialResult:
    return TrialResult(
        trial=n, state=TrialState.COMPLETE, value=91.5, candidate=Candidate(),
        launch=LAUNCH, metrics={"tok_s_mean": 91.5},
        requests=(_request(0), _request(1, FailureReason.CRASH_MID_BENCHMARK)),
        start_unix_s=10.0, end_unix_s=12.5,
    )  # fmt: skip


def test_a_request_failure_reads_back_as_a_failure_reason(tmp_path) -> None:
    store = ParquetTrialStore(str(tmp_path))
    written = _result(0)
    store.append_trial(written)
    rows = store.load_requests().to_pylist()
    assert [r["failure"] for r in rows] == [None, "crash_mid_benchmark"]
    assert rows[1]["error"] == "connection lost after 3 tokens"  # the message, no prefix
    ok, failed = (request_record(r) for r in rows)
    assert ok.ok and ok.failure is None
    assert failed.failure is FailureReason.CRASH_MID_BENCHMARK and not failed.ok
    assert failed == written.requests[1]


def test_a_request_row_without_the_failure_column_is_an_unknown_failure() -> None:
    row = {"scenario": "single", "run": 0, "index": 0, "concurrency": 1, "prompt_tokens": 1.0,
           "completion_tokens": 1.0, "error": "crash_mid_benchmark: lost"}  # fmt: skip
    assert request_record(row).failure is FailureReason.UNKNOWN  # never parsed from the text
