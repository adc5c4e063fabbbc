"""Prompt categories on the client side: each request's category, kept with its record, sent
to the twin only, aggregated per trial and stored."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from rayspec import Candidate
from rayspec import RequestRecord
from rayspec import TrialResult
from rayspec._types import category_key
from rayspec.bench import Scenario
from rayspec.bench import StreamClient
from rayspec.bench import category_metrics
from rayspec.bench import dataset_categories
from rayspec.bench import load_dataset
from rayspec.bench import request_input
from rayspec.bench import run_tok_s
from rayspec.bench import summarize
from rayspec.store import ParquetTrialStore
from rayspec.store import request_record
from tests.bench_tests.test_bench_transport import CHUNKS
from tests.bench_tests.test_bench_transport import _Canned
from tests.bench_tests.test_bench_transport import _sse

CATS = ("chat", "code", "long-form", "math")


def test_each_request_takes_the_category_of_its_prompt() -> None:
    scenario = Scenario(name="c1", prompt_set="mixed", requests_per_run=8)
    by_text = {r.text: r.category for r in load_dataset("mixed")}
    asks = [request_input(scenario, run, i) for run in range(3) for i in range(8)]
    assert all(a.category == by_text[a.prompt] for a in asks)
    assert {a.category for a in asks} == set(CATS)  # 24 consecutive prompts reach all four
    assert dataset_categories("mixed") == CATS and dataset_categories("default") == ("default",)


def test_the_mixed_set_interleaves_its_categories() -> None:
    """Requests walk the set in order from an offset: any 4 consecutive prompts (a short
    trial's) hold one of each category, not 4 of one."""
    cats = [r.category for r in load_dataset("mixed")]
    for start in range(len(cats)):
        assert {cats[(start + j) % len(cats)] for j in range(4)} == set(CATS)


def test_a_lengthened_prompt_keeps_the_category_it_starts_with() -> None:
    scenario = Scenario(name="c1", prompt_set="mixed", input_len_range=(200, 300))
    by_text = {r.text: r.category for r in load_dataset("mixed")}
    for i in range(6):
        ask = request_input(scenario, 0, i)
        first = next(t for t in by_text if ask.prompt.startswith(" ".join(t.split())))
        assert ask.category == by_text[first]


def _client_record(send: bool, category: str) -> tuple[RequestRecord, dict[str, object]]:
    handler = _Canned(_sse(CHUNKS))

    async def go() -> RequestRecord:
        transport = httpx.MockTransport(handler)
        # The wall clock: the canned chunks carry no twin clock.
        async with StreamClient(
            "http://t.test", send_category=send, transport=transport
        ) as client:
            return await client.measure(
                "p", 4, scenario="s", run=0, index=0, concurrency=2, category=category
            )

    record = asyncio.run(go())
    (request,) = handler.seen
    return record, json.loads(request.content)


def test_the_category_is_kept_on_the_record_and_sent_to_the_twin_only() -> None:
    record, body = _client_record(False, "code")
    assert record.category == "code"
    assert "rayspec_category" not in body  # a real server never receives it
    record, body = _client_record(True, "code")
    assert record.category == "code" and body["rayspec_category"] == "code"


def _rec(i: int, cat: str, tokens: int, e2e: float, ok: bool, run: int = 0) -> RequestRecord:
    return RequestRecord(
        scenario="s", run=run, index=i, concurrency=1, prompt_tokens=5, completion_tokens=tokens,
        ttft_ms=10.0, e2e_ms=e2e, itl_ms=(), start_unix_s=0.0,
        spec_verify_ct=max(1, tokens // 2), accept_length=tokens / max(1, tokens // 2),
        error=None if ok else "boom", category=cat,
    )  # fmt: skip


_records = st.lists(
    st.tuples(
        st.sampled_from(CATS),
        st.integers(1, 500),
        st.floats(1.0, 5000.0),
        st.booleans(),
        st.integers(-1, 3),
    ),
    max_size=40,
).map(lambda xs: [_rec(i, *x[:4], run=x[4]) for i, x in enumerate(xs)])


@settings(max_examples=60, deadline=None)
@given(_records)
def test_per_category_counts_add_up_to_the_trials_requests(records: list[RequestRecord]) -> None:
    figures = category_metrics(records, scenario="s")
    summary = summarize(records, scenario="s")
    counts = [v for k, v in figures.items() if k.endswith("__requests")]
    assert sum(counts) == summary["requests_ok"] + summary["requests_failed"]
    for cat in CATS:
        mine = [r for r in records if r.category == cat and r.run >= 0]
        if not mine:
            assert category_key(cat, "requests") not in figures
            continue
        tok_s = figures[category_key(cat, "tok_s")]
        expected = run_tok_s(mine)  # concurrency 1: tokens over the summed request times
        assert (math.isnan(tok_s) and math.isnan(expected)) or math.isclose(tok_s, expected)


def test_category_figures_are_stored_as_rows_not_columns(tmp_path, caplog) -> None:
    records = tuple(_rec(i, CATS[i % 2], 100 + i, 1000.0, True) for i in range(4))
    metrics = {"tok_s_mean": 100.0, **category_metrics(records)}
    result = TrialResult(
        trial=0, state="COMPLETE", value=100.0, candidate=Candidate(), launch=None,
        metrics=metrics, requests=records, start_unix_s=1.0, end_unix_s=2.0,
    )  # fmt: skip
    store = ParquetTrialStore(str(tmp_path))
    with caplog.at_level("WARNING"):
        store.append_trial(result)
    assert "not declared" not in caplog.text
    rows = {r["category"]: r for r in store.category_rows()}
    assert set(rows) == {"chat", "code"}  # only the categories the requests reached
    assert rows["code"]["requests"] == 2.0 and rows["code"]["trial"] == 0
    schema = pq.read_schema(store.folder.trial_file(0))
    assert not [n for n in schema.names if n.startswith("category__")]
    assert "tok_s_mean" in store.trial_rows()[0]
    stored = store.load_requests().to_pylist()
    assert [request_record(r).category for r in stored] == [r.category for r in records]


def test_request_rows_written_before_the_category_column_read_as_default(tmp_path) -> None:
    records = (_rec(0, "code", 10, 100.0, True),)
    result = TrialResult(
        trial=0, state="COMPLETE", value=1.0, candidate=Candidate(), launch=None,
        metrics={}, requests=records, start_unix_s=1.0, end_unix_s=2.0,
    )  # fmt: skip
    store = ParquetTrialStore(str(tmp_path))
    store.append_trial(result)
    path = store.folder.requests + "/trial-000000.parquet"
    old = pq.read_table(path).drop_columns(["category"])  # as an older rayspec wrote it
    pq.write_table(old, path)
    (row,) = store.load_requests().to_pylist()
    assert request_record(row) == dataclasses.replace(records[0], category="default")
    assert isinstance(store.load_requests(), pa.Table)
