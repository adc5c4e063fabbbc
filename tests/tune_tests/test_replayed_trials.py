"""The replay of a recorded landscape (rayspec.testing.ReplayedTrials): a study on a real
engine's recorded starts, through the real study loop, in seconds.

The landscape here is synthetic (rayspec.testing.synthetic_landscape: a toy node in the recorded
format); a recorded one under ``benchmarks/landscapes/`` runs the same small study, checked for
what the replay must do whatever its numbers are."""

from __future__ import annotations

import glob
import os
import statistics
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rayspec._config import load_config
from rayspec._exceptions import ConfigError
from rayspec._exceptions import FailureReason
from rayspec._exceptions import StoreError
from rayspec._types import Candidate
from rayspec._types import RequestRecord
from rayspec._types import RunDecision
from rayspec._types import SpecSettings
from rayspec.results import candidate_reader
from rayspec.search import SearchSpace
from rayspec.store import ParquetTrialStore
from rayspec.store import read_landscape
from rayspec.store import request_record
from rayspec.testing import ReplayedTrials
from rayspec.testing import synthetic_landscape
from rayspec.tune import run_study
from tests.helpers import REPO
from tests.helpers import write_experiment

SPACE = {
    "modes": ["off", "EAGLE3"],
    "num_steps": [1, 2, 3],
    "eagle_topk": [1, 2],
    "num_draft_tokens": [2, 3, 4, 6],
}
RECORDED = sorted(glob.glob(os.path.join(REPO, "benchmarks", "landscapes", "cpu-*.parquet")))
RECORDED_SPACE = os.path.join(REPO, "benchmarks", "spaces", "cpu-landscape.yaml")


def _experiment(folder: str, budget: int = 8, seed: int = 0) -> str:
    return write_experiment(
        folder,
        {
            "study": {"name": "replay", "max_restarts": budget, "seed": seed},
            "server": {"engine": "twin", "tp_size": 1, "twin": {"profile": "kimi-k2.5-tp8-pcie"}},
            "search": {"speculative": SPACE},
            "bench": {"warmup": 1, "repeats": 4, "max_tokens": 64},
            "output": {"dir": os.path.join(folder, "runs")},
        },
    )


def _settings(space: SearchSpace) -> list[SpecSettings | None]:
    out: list[SpecSettings | None] = [None]
    for k in space.num_steps:
        for m in space.eagle_topk:
            for n in [k + 1] if m == 1 else space.num_draft_tokens:
                spec = SpecSettings("EAGLE3", k, m, n)
                if spec.fits_tree:
                    out.append(spec)
    return out


@pytest.fixture
def toy(tmp_path: Any) -> tuple[str, str]:
    """A synthetic landscape of every setting of SPACE (3 starts x 4 runs), and its experiment."""
    exp = _experiment(str(tmp_path))
    space = SearchSpace.from_config(load_config(exp).search)
    land = synthetic_landscape(
        tmp_path / "cpu-toy.parquet", settings=_settings(space), starts=3, runs=4
    )
    return land.path, exp


def test_a_landscape_reads_back_as_written_and_a_broken_one_names_its_column(
    tmp_path: Any,
) -> None:
    land = synthetic_landscape(tmp_path / "a.parquet", starts=2, runs=3, warmup=1)
    again = read_landscape(land.path)
    assert again.rows == land.rows and again.meta["max_tokens"] == 64
    off = [r for r in land.rows if r.mode == "off"]
    assert off and all(r.num_steps is None and r.accept_histogram is None for r in off)
    assert {r.run for r in land.rows} == {-1, 0, 1, 2} and {r.start for r in land.rows} == {0, 1}
    table = pq.read_table(land.path).drop(["tok_s"])
    pq.write_table(table, tmp_path / "b.parquet")
    with pytest.raises(StoreError, match="column 'tok_s' is missing"):
        read_landscape(str(tmp_path / "b.parquet"))
    bad = pq.read_table(land.path).set_column(
        1, "mode", pa.array([None] * len(land.rows), pa.string())
    )
    pq.write_table(bad, tmp_path / "c.parquet")
    with pytest.raises(StoreError, match="column 'mode' holds nulls"):
        read_landscape(str(tmp_path / "c.parquet"))


def test_a_replayed_study_serves_the_recorded_starts(toy: tuple[str, str]) -> None:
    path, exp = toy
    cfg = load_config(exp)
    space = SearchSpace.from_config(cfg.search)
    replay = ReplayedTrials(path)
    run_study(cfg, trial_fn=replay, printer=lambda _line: None, space=space)
    store = ParquetTrialStore(cfg.out_dir)
    records = store.load_records(candidate_reader(space))
    requests: dict[int, list[RequestRecord]] = {}
    for row in store.load_requests().to_pylist():
        requests.setdefault(int(row["trial"]), []).append(request_record(row))
    launched = [r for r in records if r.launched]
    assert [r.trial for r in launched] == replay.launches and len(launched) >= 3
    assert not [r for r in records if r.result.failure is not None]  # the gate passed them all
    served = {trial: (label, start) for trial, label, start in replay.served}
    for rec in launched:
        label, start = served[rec.trial]
        assert rec.candidate.label() == label
        recorded = next(s for s in replay.starts(label) if s.start == start)
        runs = sorted({q.run for q in requests[rec.trial] if q.run >= 0})
        assert runs == list(range(len(runs)))
        own = {row.e2e_ms for r in recorded.measured for row in recorded.runs[r]}
        for q in requests[rec.trial]:  # the recorded requests as recorded, then resampled
            if q.run in recorded.runs:
                row = recorded.runs[q.run][q.index]
                assert (q.e2e_ms, q.accept_histogram, q.output_ids) == (
                    row.e2e_ms,
                    row.accept_histogram,
                    row.output_ids,
                )
            else:
                assert q.e2e_ms in own
        tok_s = [q.completion_tokens / (q.e2e_ms / 1000) for q in requests[rec.trial]
                 if q.run >= 0]  # fmt: skip
        assert rec.result.metrics["tok_s_mean"] == pytest.approx(statistics.mean(tok_s))
    # A setting started again gets another recorded start while one is left.
    chain = Candidate(spec=SpecSettings("EAGLE3", 1, 1, 2))
    again = ReplayedTrials(path)
    for number in range(1, 5):
        again(cfg, number, chain)
    starts = [start for _, _, start in again.served]
    assert sorted(starts[:3]) == [0, 1, 2] and starts[3] in (0, 1, 2)
    best = max(replay.settings, key=replay.truth)
    every = [s.run_tok_s(r) for s in replay.starts(best) for r in s.measured]
    assert replay.truth(best) == pytest.approx(statistics.mean(every))


def test_the_same_seed_replays_the_same_study(toy: tuple[str, str], tmp_path: Any) -> None:
    path, _ = toy
    served = []
    for n, seed in enumerate((3, 3, 4)):
        (tmp_path / f"s{n}").mkdir()
        exp = _experiment(str(tmp_path / f"s{n}"), budget=6, seed=seed)
        replay = ReplayedTrials(path)
        run_study(load_config(exp), trial_fn=replay, printer=lambda _line: None)
        served.append(replay.served)
    assert served[0] == served[1]
    assert served[0] != served[2]


def test_runs_past_the_recorded_ones_are_the_starts_own_again(toy: tuple[str, str]) -> None:
    path, exp = toy
    cfg = load_config(exp, ["bench.max_repeats=10"])
    replay = ReplayedTrials(path)
    chain = Candidate(spec=SpecSettings("EAGLE3", 2, 1, 3))
    result = replay(cfg, 5, chain, on_runs=lambda _n, _v: RunDecision.EXTEND)
    ((_, label, start),) = replay.served
    recorded = next(s for s in replay.starts(label) if s.start == start)
    own = {round(recorded.run_tok_s(r), 9) for r in recorded.measured}
    by_run = {q.run: q for q in result.requests}
    assert sorted(by_run) == [-1, *range(10)]  # the warm-up, 4 recorded runs, 6 more
    for run, q in by_run.items():
        if run >= 0:
            assert round(q.completion_tokens / (q.e2e_ms / 1000), 9) in own
    assert by_run[2].e2e_ms == recorded.runs[2][0].e2e_ms  # recorded runs in their order
    assert by_run[7].output_ids is None  # no start of it recorded a run 7: nothing to compare
    assert result.metrics["runs"] == 10


def test_a_setting_the_landscape_lacks_fails_infeasible_without_a_restart(
    toy: tuple[str, str],
) -> None:
    path, exp = toy
    replay = ReplayedTrials(path)
    deep = Candidate(spec=SpecSettings("EAGLE3", 5, 1, 6))
    result = replay(load_config(exp), 2, deep)
    assert result.failure is FailureReason.INFEASIBLE and not result.costs_restart
    assert f"not in the recorded landscape {path}" in result.failure_detail
    assert replay.launches == []
    with pytest.raises(KeyError):
        replay.truth(deep)
    with pytest.raises(ConfigError, match="bench.scenarios"):
        replay(load_config(exp, ["bench.concurrency=4"]), 3, Candidate())


@pytest.mark.parametrize("path", RECORDED, ids=os.path.basename)
def test_a_small_replay_study_on_a_recorded_landscape(path: str, tmp_path: Any) -> None:
    """CI's small study on a real engine's recording (none pinned here: the numbers are the
    recording's): every launched trial is a recorded start of a recorded setting, the gate
    compares the recorded outputs and passes them, and the pick is a recorded setting."""
    replay = ReplayedTrials(path)
    exp = _experiment(str(tmp_path), budget=6)
    cfg = load_config(exp, [RECORDED_SPACE])
    space = SearchSpace.from_config(cfg.search)
    outcome = run_study(cfg, trial_fn=replay, printer=lambda _line: None, space=space)
    records = ParquetTrialStore(cfg.out_dir).load_records(candidate_reader(space))
    assert [r.trial for r in records if r.launched] == replay.launches
    assert not [r for r in records if r.result.failure is not None]
    best = outcome.report.best
    assert best is not None and best.candidate.label() in replay.settings
