"""Per-concurrency optima written as SGLang adaptive tiers (--speculative-adaptive-config)."""

from __future__ import annotations

import dataclasses
import json
import os

from rayspec import Candidate
from rayspec import SpecSettings
from rayspec.results import Row
from rayspec.results import StudyReport
from rayspec.results import write_best
from rayspec.store import StudyFolder
from rayspec.tune._tiers import adaptive_tiers
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import cached_config

SCENARIOS = (
    "bench.scenarios=[{name: c1, concurrency: 1, requests_per_run: 1, max_tokens: 100},"
    "{name: c16, concurrency: 16, requests_per_run: 16, max_tokens: 100}]"
)
NCCL = (("NCCL_PROTO", "LL"),)


def _row(trial: int, spec: SpecSettings | None, c1: float, c16: float) -> Row:
    return Row(
        trials=(trial,), label=f"trial {trial}", candidate=Candidate(nccl_env=NCCL, spec=spec),
        role="", tok_s_mean=c1, tok_s_runs=c1, tok_s_peak=c1, accept_length=float("nan"),
        sd=0.01, starts=1, runs=5, per_scenario=(("c16", c16),),
    )  # fmt: skip
    # As build_report makes it: the first scenario (c1) is the objective, tok_s_mean; only the
    # others are per_scenario (their metrics are stored as <scenario>__tok_s_mean).


def _report(*rows: Row) -> StudyReport:
    return StudyReport(rows=rows, baseline=rows[0], best=rows[1], failed=0, pruned=0, total=3)


def _cfg(tmp_path, *extra: str):
    return cached_config(TWIN_EXPERIMENT, [SCENARIOS, *extra], out=tmp_path)


def test_each_concurrency_gets_its_best_chain_or_no_speculation(tmp_path) -> None:
    report = _report(
        _row(0, None, 60.0, 700.0),
        _row(1, SpecSettings("EAGLE3", 2, 4, 6), 99.0, 500.0),  # a tree: not a tier
        _row(2, SpecSettings("EAGLE3", 2, 1, 3), 92.0, 560.0),
        _row(3, SpecSettings("EAGLE3", 3, 1, 4), 93.0, 540.0),
    )
    cfg = _cfg(tmp_path)
    found = adaptive_tiers(cfg, report)
    assert found is not None
    # Concurrency 1: 3 steps beat 2; concurrency 16: speculation loses, 0 steps.
    assert found.tiers == {"1": {"candidate_steps": [3]}, "16": {"candidate_steps": [0]}}
    assert found.start_steps == 3
    # No trial verified them: best.sh stays the pick, best-adaptive.sh launches the tiers.
    write_best(cfg, report, plan=found.plan)
    folder = StudyFolder(cfg.out_dir)
    with open(folder.adaptive_tiers, encoding="utf-8") as fh:
        assert json.load(fh) == found.tiers
    with open(folder.best_adaptive_sh, encoding="utf-8") as fh:
        script = fh.read()
    line = next(line for line in script.splitlines() if line.startswith("exec "))
    assert "--speculative-adaptive --" in line and "--speculative-adaptive-config " in line
    assert "--speculative-num-steps 3 --speculative-eagle-topk 1" in line
    assert "export NCCL_PROTO=LL" in script and "sglang.launch_server" in line
    assert "# not verified: no trial ran this plan" in script
    with open(folder.best_sh, encoding="utf-8") as fh:
        assert "--speculative-adaptive" not in fh.read()


def test_no_tiers_without_two_loads_or_where_speculation_never_wins(tmp_path) -> None:
    rows = (_row(0, None, 60.0, 700.0), _row(1, SpecSettings("EAGLE3", 2, 1, 3), 50.0, 500.0))
    assert adaptive_tiers(_cfg(tmp_path), _report(*rows)) is None
    one_load = cached_config(TWIN_EXPERIMENT, out=tmp_path)
    assert adaptive_tiers(one_load, _report(*rows)) is None
    old = _cfg(tmp_path, "server.twin.version=0.5.21")
    faster = (rows[0], _row(1, SpecSettings("EAGLE3", 2, 1, 3), 90.0, 500.0))
    assert adaptive_tiers(_cfg(tmp_path), _report(*faster)) is not None
    assert adaptive_tiers(old, _report(*faster)) is None  # no --speculative-adaptive before 0.5.23


def test_a_poisson_rung_is_not_a_tier_its_concurrency_is_only_a_cap(tmp_path) -> None:
    """c1 plus a rate rung capped at 64 in flight: one batch size measured, so no tiers (a
    tier "64" would claim a batch size that rung never held)."""
    rows = (_row(0, None, 60.0, 700.0), _row(1, SpecSettings("EAGLE3", 2, 1, 3), 90.0, 500.0))
    ladder = cached_config(TWIN_EXPERIMENT, [
        "bench.ladder.concurrency=[1]", "bench.ladder.request_rate=[4]",
    ], out=tmp_path)  # fmt: skip
    report = _report(rows[0], dataclasses.replace(rows[1], per_scenario=(("r4", 500.0),)))
    assert adaptive_tiers(ladder, report) is None
    closed = cached_config(TWIN_EXPERIMENT, [
        "bench.ladder.concurrency=[1,16]",
        "bench.ladder.request_rate=[4]",
    ], out=tmp_path)  # fmt: skip
    rows16 = (rows[0], dataclasses.replace(rows[1], per_scenario=(("c16", 500.0), ("r4", 500.0))))
    found = adaptive_tiers(closed, _report(*rows16))
    assert found is not None and set(found.tiers) == {"1", "16"}


def test_the_plan_is_data_tiers_nccl_and_a_launch_that_carries_the_file(tmp_path) -> None:
    """The plan: the tiers, the NCCL set of the best chain at the lowest load, the algorithm;
    its launch carries the tiers as a file for the node, never as text in argv."""
    from rayspec.results import PLAN_PARAM
    from rayspec.results import Plan
    from rayspec.results import candidate_reader
    from rayspec.search import SearchSpace
    from rayspec.server import build_launch

    report = _report(
        _row(0, None, 60.0, 700.0),
        _row(1, SpecSettings("EAGLE3", 3, 1, 4), 93.0, 540.0),
    )
    cfg = _cfg(tmp_path)
    found = adaptive_tiers(cfg, report)
    assert found is not None
    plan = found.plan
    assert plan.tiers == ((1, (3,)), (16, (0,))) and plan.nccl_env == NCCL
    assert plan.steps_at(1) == 3 and plan.steps_at(8) == 3 and plan.steps_at(64) == 0
    assert Plan.from_json(plan.to_json()) == plan
    cand = plan.candidate()
    assert cand.spec == SpecSettings("EAGLE3", 3, 1, 4, adaptive=True)
    assert cand.adaptive_tiers == plan.tiers and "tiers 1:3 16:0" in cand.label()
    launch = build_launch(cfg, cand, port=30000, log_path="x.log")
    assert "--speculative-adaptive" in launch.argv
    assert "--speculative-adaptive-config" not in launch.argv
    assert launch.files == ((
        "--speculative-adaptive-config",
        json.dumps({"1": {"candidate_steps": [3]}, "16": {"candidate_steps": [0]}}, indent=2)
        + "\n",
    ),)  # fmt: skip
    # A stored verification trial reads back as the plan, whatever the space holds.
    read = candidate_reader(SearchSpace.from_config(cfg.search))
    assert read({PLAN_PARAM: plan.to_json()}) == cand


def test_with_files_writes_beside_the_log_and_appends_flag_and_path(tmp_path) -> None:
    from rayspec.server import build_launch
    from rayspec.server._files import with_files

    cfg = _cfg(tmp_path)
    cand = Candidate(
        spec=SpecSettings("EAGLE3", 2, 1, 3, adaptive=True), adaptive_tiers=((1, (2,)),)
    )
    launch = build_launch(cfg, cand, port=30000, log_path=str(tmp_path / "t.log"))
    started = with_files(launch, str(tmp_path), "t")
    flag, path = started.argv[-2:]
    assert flag == "--speculative-adaptive-config" and started.files == ()
    assert os.path.dirname(path) == str(tmp_path)
    with open(path, encoding="utf-8") as fh:
        assert json.load(fh) == {"1": {"candidate_steps": [2]}}
    plain = build_launch(cfg, Candidate(), port=30000, log_path="x")
    assert with_files(plain, str(tmp_path)) is plain
