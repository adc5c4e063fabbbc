"""A reusable contract suite for trial stores (as Optuna's ``StorageTestCase``)."""

from __future__ import annotations

import time

import pytest

from rayspec._exceptions import FailureReason
from rayspec._types import Candidate
from rayspec._types import RequestRecord
from rayspec._types import SpecSettings
from rayspec._types import TrialResult
from rayspec._types import TrialState
from rayspec.store import BaseTrialStore


def _result(trial: int, state: str = "COMPLETE", **metrics: float) -> TrialResult:
    record = RequestRecord(
        scenario="single", run=0, index=0, concurrency=1, prompt_tokens=10,
        completion_tokens=50, ttft_ms=40.0, e2e_ms=600.0, itl_ms=(11.0,) * 49,
        start_unix_s=time.time(), spec_verify_ct=25, accept_length=2.0,
    )  # fmt: skip
    return TrialResult(
        trial=trial, state=TrialState(state), value=metrics.get("tok_s_mean"),
        candidate=Candidate(spec=SpecSettings("EAGLE3", 2, 1, 3)), launch=None,
        metrics=metrics, requests=(record,), start_unix_s=1.0, end_unix_s=2.0,
        failure=None if state == "COMPLETE" else FailureReason.UNKNOWN,
    )  # fmt: skip


class TrialStoreTestCase:
    """Subclass and override the ``store`` fixture to check a :class:`BaseTrialStore`."""

    @pytest.fixture
    def store(self) -> BaseTrialStore:
        raise NotImplementedError

    def test_empty(self, store: BaseTrialStore) -> None:
        assert store.load_trials().num_rows == 0
        assert store.trial_numbers() == set()

    def test_one_row_per_trial(self, store: BaseTrialStore) -> None:
        store.append_trial(_result(0, tok_s_mean=80.0))
        store.append_trial(_result(1, "FAIL"))
        assert store.trial_numbers() == {0, 1}
        assert store.load_requests().num_rows == 2

    def test_rewrite_replaces(self, store: BaseTrialStore) -> None:
        store.append_trial(_result(3, "FAIL"))
        store.append_trial(_result(3, tok_s_mean=81.0))
        rows = store.load_trials().to_pylist()
        assert len(rows) == 1 and rows[0]["state"] == "COMPLETE" and rows[0]["value"] == 81.0

    def test_columns_may_differ_between_trials(self, store: BaseTrialStore) -> None:
        store.append_trial(_result(0, tok_s_mean=80.0))
        store.append_trial(_result(1, tok_s_mean=82.0, accept_length=1.9))
        rows = {r["trial"]: r for r in store.load_trials().to_pylist()}
        assert rows[1]["accept_length"] == 1.9 and rows[0]["accept_length"] is None
