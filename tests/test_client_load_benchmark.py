"""The client-load benchmark (benchmarks/client_load.py) at a tiny size: its table has the
promised columns and its workers overlap (no timing assertions)."""

from __future__ import annotations

import asyncio
from types import ModuleType

import pytest

from rayspec.testing._twin import TwinProcess
from tests.helpers import load_benchmark


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("client_load")


def test_mean_in_flight_is_time_weighted(bench: ModuleType) -> None:
    # Two requests over [0, 2] and [1, 2]: 3 request-seconds in 2 s.
    assert bench.mean_in_flight([(0.0, 2.0), (1.0, 2.0)]) == pytest.approx(1.5)
    assert bench.mean_in_flight([(0.0, 1.0), (1.0, 2.0)]) == pytest.approx(1.0)


def test_four_streams_overlap_and_the_table_has_its_columns(bench: ModuleType) -> None:
    args = ["--tp-size", "8", "--twin-profile", bench.PROFILE, "--max-running-requests", "16"]
    with TwinProcess(args) as twin:
        twin.wait_ready(60)
        row = asyncio.run(bench.drive(twin.base_url, 4, 8, 1))
    assert row.concurrency == 4 and row.requests == 4
    assert row.in_flight > 1.0
    assert 0.0 < row.ratio <= 1.0 + 1e-9
    assert row.tok_s > 0 and row.cpu_s_per_1k_tok > 0
    head = bench.table([row]).splitlines()[0]
    assert [c.strip() for c in head.split("|")] == list(bench.COLUMNS)
