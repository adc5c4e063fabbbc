"""The CPU landscape's recorder, file, summary and twin fit (benchmarks/record_landscape.py,
benchmarks/landscape/, benchmarks/landscape_twin_fit.py): their pure parts, and the committed
recordings against the space file. No server is started here."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import ModuleType

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks.landscape import store
from benchmarks.landscape import summary
from rayspec._config import load_config
from rayspec._types import Candidate
from rayspec._types import RequestRecord
from rayspec._types import SpecSettings
from rayspec.bench import BenchResult
from rayspec.bench import RunReport
from rayspec.search import SearchSpace
from tests.helpers import REPO
from tests.helpers import load_benchmark

SPACE = Path(REPO) / "benchmarks" / "spaces" / "cpu-landscape.yaml"
LANDSCAPES = Path(REPO) / "benchmarks" / "landscapes"


@pytest.fixture(scope="module")
def recorder() -> ModuleType:
    return load_benchmark("record_landscape")


@pytest.fixture(scope="module")
def twin_fit() -> ModuleType:
    return load_benchmark("landscape_twin_fit")


def _space_labels() -> list[str]:
    cfg = load_config(str(SPACE), ["study.name=landscape", "server.engine=twin"])
    space = SearchSpace.from_config(cfg.search)
    return [space.candidate(p).label() for p in space.grid_points()]


def test_the_space_file_is_no_speculation_and_20_eagle3_settings_by_sglangs_rules() -> None:
    labels = _space_labels()
    assert len(labels) == 21 and labels[0].startswith("no speculation")
    assert sum("EAGLE3" in label for label in labels) == 20
    # topk 1 forces steps + 1 draft tokens; a tree that cannot hold its budget is no setting
    assert "EAGLE3 3 steps, topk 1, 4 draft tokens; NCCL default" in labels
    assert not any("1 step, topk 2" in label for label in labels)  # 2 nodes < 5 drafts
    assert not any("2 steps, topk 2, 8 draft tokens" in label for label in labels)
    # no tree whose budget is below steps + 1: SGLang 0.5.23 crashes at its first verify
    space = SearchSpace.from_config(
        load_config(str(SPACE), ["study.name=landscape", "server.engine=twin"]).search
    )
    for point in space.grid_points():
        spec = space.candidate(point).spec
        assert spec is None or spec.num_draft_tokens >= spec.num_steps + 1


def test_every_start_is_planned_once_per_round_in_a_seeded_shuffled_order(
    recorder: ModuleType,
) -> None:
    labels = [f"s{i}" for i in range(8)]
    plan = recorder.plan_starts(labels, drafter="strong", starts=3, seed=0, done=set())
    assert sorted(plan) == sorted((r, s) for r in range(3) for s in labels)
    assert [r for r, _ in plan] == sorted(r for r, _ in plan)  # round by round
    rounds = [[s for r, s in plan if r == k] for k in range(3)]
    assert rounds[0] != rounds[1] != rounds[2]  # each round its own order
    again = recorder.plan_starts(labels, drafter="strong", starts=3, seed=0, done=set())
    assert again == plan
    assert recorder.plan_starts(labels, drafter="mid", starts=3, seed=0, done=set()) != plan


def test_a_resumed_plan_skips_what_the_files_hold(recorder: ModuleType) -> None:
    labels = ["off", "a", "b"]
    done = {("off", 0), ("off", 1), ("a", 0)}  # off's starts came from another drafter's file
    plan = recorder.plan_starts(labels, drafter="mid", starts=2, seed=0, done=done)
    assert sorted(plan) == [(0, "b"), (1, "a"), (1, "b")]


def _record(run: int, tokens: int = 96, accept: float | None = 2.0) -> RequestRecord:
    return RequestRecord(
        scenario="c1",
        run=run,
        index=0,
        concurrency=1,
        prompt_tokens=100,
        completion_tokens=tokens,
        ttft_ms=50.0,
        e2e_ms=4800.0,
        itl_ms=(40.0, 41.0),
        start_unix_s=1.0,
        spec_verify_ct=48 if accept else None,
        accept_length=accept,
        output_ids=(5, 6, 7),
        accept_histogram=(10, 38) if accept else None,
    )


def _result(accept: float | None) -> BenchResult:
    records = tuple(_record(r, accept=accept) for r in (-1, 0, 1))
    runs = tuple(
        RunReport(scenario="c1", run=r.run, records=(r,), wall_s=5.0, client_cpu_s=0.1, tok_s=20.0)
        for r in records
    )
    return BenchResult(records=records, runs=runs)


def test_rows_of_a_start_are_the_files_columns_and_round_trip(
    recorder: ModuleType, tmp_path: Path
) -> None:
    spec = Candidate(spec=SpecSettings("EAGLE3", 1, 1, 2))
    rows = recorder.rows_of(
        _result(2.0),
        spec,
        drafter="strong",
        start=2,
        startup_s=40.0,
        load_1m=3.5,
        started_unix_s=9.0,
    )
    off = recorder.rows_of(
        _result(None),
        Candidate(),
        drafter="strong",
        start=0,
        startup_s=41.0,
        load_1m=3.0,
        started_unix_s=8.0,
    )
    assert [r["run"] for r in rows] == [-1, 0, 1]
    assert set(rows[0]) == set(store.COLUMNS)
    assert rows[1]["setting"] == spec.label() and rows[1]["num_draft_tokens"] == 2
    assert off[1]["mode"] == "off" and off[1]["num_steps"] is None
    assert off[1]["accept_length"] is None and off[1]["accept_histogram"] is None
    path = tmp_path / "cpu-strong.parquet"
    store.write_landscape(path, rows + off, {"drafter": "strong"})
    back, meta = store.read_landscape(path)
    assert meta == {"drafter": "strong"}
    assert back[0]["mode"] == "off"  # no speculation first, then by setting, start, run
    assert sorted(back, key=lambda r: (r["setting"], r["run"])) == sorted(
        rows + off, key=lambda r: (r["setting"], r["run"])
    )
    schema = pq.read_schema(path)
    assert schema.names == list(store.COLUMNS)
    assert schema.field("itl_ms").type.value_type == pa.float64()
    assert schema.field("accept_histogram").type.value_type == pa.int64()
    assert schema.field("start").type == pa.int32()
    assert store.starts_done(back) == {(spec.label(), 2), (Candidate().label(), 0)}


def _rows(setting: str, mode: str, starts: dict[int, list[float]]) -> list[dict[str, object]]:
    out = []
    for start, values in starts.items():
        for run, tok_s in enumerate(values):
            out.append(
                {
                    "setting": setting,
                    "mode": mode,
                    "num_steps": 3 if mode != "off" else None,
                    "eagle_topk": 1,
                    "num_draft_tokens": 4,
                    "start": start,
                    "run": run,
                    "tok_s": tok_s,
                    "accept_length": 2.0 if mode != "off" else None,
                    "startup_s": 40.0,
                    "load_1m": 2.0,
                    "output_ids": [run],
                }
            )
    return out


def test_setting_statistics_are_over_start_means() -> None:
    rows = _rows("x", "EAGLE3", {0: [10.0, 12.0], 1: [20.0, 22.0], 2: [30.0, 32.0]})
    rows += [dict(r, run=-1, tok_s=1000.0) for r in rows[:1]]  # a warm-up never counts
    (s,) = summary.setting_stats(rows)
    assert s.mean == pytest.approx(21.0) and s.starts == 3 and s.runs == 6
    assert s.start_sd == pytest.approx(10.0)
    assert s.run_sd == pytest.approx(math.sqrt(2.0))
    half = 4.302652729749464 * 10.0 / math.sqrt(3)  # t(0.975, 2)
    assert (s.low, s.high) == (pytest.approx(21.0 - half), pytest.approx(21.0 + half))


def test_gain_and_greedy_agreement() -> None:
    off = _rows("off", "off", {0: [10.0, 10.0], 1: [10.0, 10.0]})
    spec = _rows("x", "EAGLE3", {0: [20.0, 20.0], 1: [20.0, 20.0]})
    spec[1]["output_ids"] = [99]  # run 1 of start 0 differs from no speculation's run 1
    stats = {s.setting: s for s in summary.setting_stats(off + spec)}
    g, lo, hi = summary.gain(stats["x"], stats["off"])
    assert g == pytest.approx(1.0) and lo == pytest.approx(1.0) and hi == pytest.approx(1.0)
    assert summary.greedy_agreement(off + spec, "x") == (3, 4)


def test_depth_acceptance_pools_the_chains_histograms(twin_fit: ModuleType) -> None:
    rows = [
        {
            "run": 0,
            "mode": "EAGLE3",
            "num_steps": 2,
            "eagle_topk": 1,
            "num_draft_tokens": 3,
            "accept_histogram": [2, 3, 5],
        },
        {
            "run": 0,
            "mode": "EAGLE3",
            "num_steps": 1,
            "eagle_topk": 1,
            "num_draft_tokens": 2,
            "accept_histogram": [4, 6],
        },
        {
            "run": -1,
            "mode": "EAGLE3",
            "num_steps": 1,
            "eagle_topk": 1,
            "num_draft_tokens": 2,
            "accept_histogram": [100, 0],
        },  # a warm-up: not counted
    ]
    acc = twin_fit.depth_acceptance(rows, {(2, 1, 3), (1, 1, 2)})
    assert acc == [pytest.approx(14 / 20), pytest.approx(5 / 8)]


def test_the_cost_fit_is_non_negative_least_squares(twin_fit: ModuleType) -> None:
    a = np.array([[1.0, 1.0, 1.0], [3.0, 1.0, 3.0], [5.0, 1.0, 5.0], [7.0, 1.0, 3.0]])
    x_true = np.array([0.5, 10.0, 2.0])
    assert twin_fit.nnls_small(a, a @ x_true) == pytest.approx(x_true)
    x = twin_fit.nnls_small(a, a @ np.array([-0.5, 10.0, 2.0]))
    assert np.all(x >= 0)


@pytest.mark.parametrize("path", sorted(LANDSCAPES.glob("cpu-*.parquet")), ids=lambda p: p.stem)
def test_a_committed_landscape_is_of_the_space_and_the_format(path: Path) -> None:
    assert path.stat().st_size < 2_000_000
    assert pq.read_schema(path).names == list(store.COLUMNS)
    rows, meta = store.read_landscape(path)
    labels = set(_space_labels())
    assert {r["setting"] for r in rows} <= labels
    assert {r["drafter"] for r in rows} <= {path.stem.removeprefix("cpu-")}
    for key in (
        "sglang_version",
        "model_recipe",
        "models",
        "server_flags",
        "max_tokens",
        "machine",
        "command",
    ):
        assert key in meta, key
    assert json.loads(json.dumps(meta)) == meta
    by_start: dict[tuple[str, int], list[int]] = {}
    for r in rows:
        by_start.setdefault((r["setting"], r["start"]), []).append(r["run"])
    for runs in by_start.values():  # every start kept whole: its warm-up and its runs
        assert sorted(runs) == list(range(-1, meta["runs_per_start"]))
