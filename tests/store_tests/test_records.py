"""A trial row is one typed record: what the driver writes is what resume and the report read
back (candidates through the search space, run values and request failures typed)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from rayspec import Candidate
from rayspec import FailureReason
from rayspec import LaunchSpec
from rayspec import RequestRecord
from rayspec import SpecSettings
from rayspec import StoreError
from rayspec import TrialRecord
from rayspec import TrialResult
from rayspec._types import TrialState
from rayspec.results import candidate_reader
from rayspec.results import observations_from_records
from rayspec.search import SearchSpace
from rayspec.store import ParquetTrialStore
from rayspec.store import request_record

# Flags declared out of name order: the candidate keeps the declared order, which a reader
# of the row's sorted parameter JSON alone cannot know.
SPACE = SearchSpace(
    modes=("off", "EAGLE3"), num_steps=(2, 3), eagle_topk=(1, 4), num_draft_tokens=(4, 6),
    nccl=(("NCCL_PROTO", ("unset", "LL")),),
    flags=(("--mem-fraction-static", ("off", "0.8")), ("--enable-mixed-chunk", ("off", "on"))),
)  # fmt: skip
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
        accept_histogram=(5, 0, 45) if failure else (10, 20, 20),
    )  # fmt: skip


def _record(n: int) -> TrialRecord:
    params = {
        "spec.mode": "EAGLE3", "spec.num_steps": 3, "spec.eagle_topk": 4,
        "spec.num_draft_tokens": 6, "nccl.NCCL_PROTO": "LL",
        "flags.--mem-fraction-static": "0.8", "flags.--enable-mixed-chunk": "on",
    }  # fmt: skip
    result = TrialResult(
        trial=n, state=TrialState.COMPLETE, value=91.5, candidate=SPACE.candidate(params),
        launch=LAUNCH, metrics={"tok_s_mean": 91.5, "accept_length": 2.1, "runs": 3.0},
        requests=(_request(0), _request(1, FailureReason.CRASH_MID_BENCHMARK)),
        start_unix_s=10.0, end_unix_s=12.5, node="node-a",
    )  # fmt: skip
    return TrialRecord(
        result=result, params=params, run_values=(90.25, 91.5, 92.75), candidate_key="k",
        role="enqueued[0]", reason="why not", repeat_of=1, restart=4, alarm="low acceptance",
    )  # fmt: skip


def test_a_typed_record_round_trips_through_the_store(tmp_path) -> None:
    store = ParquetTrialStore(str(tmp_path))
    written = _record(2)
    store.append_trial(written)
    (read,) = store.load_records(candidate_reader(SPACE))
    assert read.candidate == written.candidate
    assert read.candidate.flags == ("--mem-fraction-static", "0.8", "--enable-mixed-chunk")
    # Everything but what the store does not keep: the requests (their own table) and the
    # launch's host, port and startup timeout (its argv holds them).
    assert read.result.launch is not None
    assert read.result.launch.argv == LAUNCH.argv and read.result.launch.env == LAUNCH.env
    stored_result = dataclasses.replace(written.result, requests=(), launch=read.result.launch)
    # The trial's histogram comes back as the row's column (the requests are not read back).
    assert read.accept_histogram == written.histogram == (10, 20, 20)
    assert read == dataclasses.replace(
        written, result=stored_result, accept_histogram=(10, 20, 20)
    )
    assert read.launched and not read.reused
    (seen,) = observations_from_records([read], {})
    assert seen.accept_histogram == (10, 20, 20)  # what the search's online model reads


def test_the_columns_stay_what_users_read(tmp_path) -> None:
    store = ParquetTrialStore(str(tmp_path))
    store.append_trial(_record(2))
    (row,) = store.load_trials().to_pylist()
    assert json.loads(row["params"])["flags.--enable-mixed-chunk"] == "on"
    assert json.loads(row["run_values"]) == [90.25, 91.5, 92.75]
    assert (row["role"], row["reason"], row["repeat_of"], row["restart"], row["alarm"]) == (
        "enqueued[0]", "why not", 1.0, 4.0, "low acceptance")  # fmt: skip
    assert row["candidate_key"] == "k" and row["note"] is None
    assert row["accept_histogram"] == [10, 20, 20]  # the successful measured requests'


def test_the_accept_histogram_is_stored_per_request_and_summed_per_trial(tmp_path) -> None:
    store = ParquetTrialStore(str(tmp_path))
    base = _record(0)
    one, two = _request(0), _request(1)
    requests = (
        one,
        dataclasses.replace(two, accept_histogram=(1, 2, 3, 4)),
        dataclasses.replace(two, run=-1, accept_histogram=(99,)),  # warm-up: not counted
        dataclasses.replace(two, index=1, accept_histogram=None),  # none sent
    )
    store.append_trial(dataclasses.replace(base, result=dataclasses.replace(
        base.result, requests=requests)))  # fmt: skip
    rows = store.load_requests().to_pylist()
    assert [r["accept_histogram"] for r in rows] == [[10, 20, 20], [1, 2, 3, 4], [99], None]
    assert tuple(request_record(r) for r in rows) == requests
    (row,) = store.load_trials().to_pylist()
    assert row["accept_histogram"] == [11, 22, 23, 4]
    store.append_trial(dataclasses.replace(base.result, trial=1, requests=()))
    assert store.load_trials().to_pylist()[1]["accept_histogram"] is None


def test_a_reused_or_unlaunched_record_is_not_a_restart(tmp_path) -> None:
    store = ParquetTrialStore(str(tmp_path))
    base = _record(0)
    store.append_trial(dataclasses.replace(base, note="reused the measurement of trial 2"))
    unlaunched = dataclasses.replace(base.result, trial=1, launch=None)
    store.append_trial(dataclasses.replace(base, result=unlaunched, restart=7))
    reused, refused = store.load_records(candidate_reader(SPACE))
    assert reused.reused and not reused.launched
    assert not refused.launched and refused.restart is None  # no launch, no restart count


def test_parameters_of_another_space_are_an_error_not_a_guess(tmp_path) -> None:
    store = ParquetTrialStore(str(tmp_path))
    store.append_trial(_record(0))
    other = dataclasses.replace(SPACE, flags=())
    with pytest.raises(StoreError, match="not of this search space"):
        store.load_records(candidate_reader(other))


def test_a_bare_result_has_no_parameters_and_reads_as_the_baseline(tmp_path) -> None:
    store = ParquetTrialStore(str(tmp_path))
    store.append_trial(dataclasses.replace(_record(0).result, candidate=Candidate()))
    (read,) = store.load_records(candidate_reader(SPACE))
    assert read.params == {} and read.candidate == Candidate() and read.run_values == ()


def test_a_request_failure_reads_back_as_a_failure_reason(tmp_path) -> None:
    store = ParquetTrialStore(str(tmp_path))
    written = _record(0)
    store.append_trial(written)
    rows = store.load_requests().to_pylist()
    assert [r["failure"] for r in rows] == [None, "crash_mid_benchmark"]
    assert rows[1]["error"] == "connection lost after 3 tokens"  # the message, no prefix
    ok, failed = (request_record(r) for r in rows)
    assert ok.ok and ok.failure is None
    assert failed.failure is FailureReason.CRASH_MID_BENCHMARK and not failed.ok
    assert failed == written.result.requests[1]


def test_a_request_row_without_the_failure_column_is_an_unknown_failure() -> None:
    row = {"scenario": "single", "run": 0, "index": 0, "concurrency": 1, "prompt_tokens": 1.0,
           "completion_tokens": 1.0, "error": "crash_mid_benchmark: lost"}  # fmt: skip
    assert request_record(row).failure is FailureReason.UNKNOWN  # never parsed from the text


def test_the_space_round_trips_as_json() -> None:
    assert SearchSpace.from_json(SPACE.to_json()) == SPACE
    spec = SpecSettings("EAGLE3", 3, 4, 6)
    assert SearchSpace.from_json(SPACE.to_json()).candidate(
        SPACE.params_of(Candidate(spec=spec))
    ) == Candidate(spec=spec)


def test_a_trial_failure_is_a_failure_reason_stored_as_its_value(tmp_path) -> None:
    store = ParquetTrialStore(str(tmp_path))
    failed = dataclasses.replace(
        _record(0).result, state=TrialState.FAIL, value=None, failure=FailureReason.NODE_LOST
    )
    store.append_trial(failed)
    (row,) = store.load_trials().to_pylist()
    assert row["failure"] == "node_lost" and type(row["failure"]) is str  # the value, verbatim
    (read,) = store.load_records(candidate_reader(SPACE))
    assert read.result.failure is FailureReason.NODE_LOST
    # Text (a stored row, a journal attribute) is accepted and typed once, like a request's.
    assert dataclasses.replace(failed, failure="node_lost").failure is FailureReason.NODE_LOST
    with pytest.raises(ValueError, match="no_such_reason"):
        dataclasses.replace(failed, failure="no_such_reason")
