"""One answer for a ladder study: what the report recommends is what best.sh launches, and each
option the report offers has its file (best-static.sh, best-adaptive.sh), written as best.sh is
(comments through one_line, every value quoted, the tiers file beside the script)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess

import yaml

from rayspec._config import load_config
from rayspec.results import plan_verdict
from rayspec.results import write_best
from rayspec.server import tiers_json
from rayspec.store import StudyFolder
from tests.helpers import TWIN_EXPERIMENT
from tests.report_tests.test_plan_verdict import LOADS
from tests.report_tests.test_plan_verdict import _study

SCENARIOS = (
    "bench.scenarios=[{name: c1, concurrency: 1, requests_per_run: 1, max_tokens: 100},"
    "{name: c16, concurrency: 16, requests_per_run: 16, max_tokens: 100}]"
)
INJECTED = "LL\n touch PWNED; $(touch PWNED2)"


def _cfg(tmp_path):
    return load_config(TWIN_EXPERIMENT, [f"output.dir={tmp_path}", SCENARIOS])


def _verdict(plan_c1: float, plan_c16: float):
    report, records = _study(plan_c1, plan_c16)
    verdict = plan_verdict(report, records, LOADS, objective="c1", start_noise=0.01)
    assert verdict is not None
    return report, verdict


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def _exec(script: str) -> str:
    return next(line for line in script.splitlines() if line.startswith("exec "))


def test_a_recommended_plan_is_best_sh_and_the_static_pick_has_its_own_file(tmp_path) -> None:
    report, verdict = _verdict(96.0, 700.0)  # faster at one stream, as fast at 16
    assert verdict.recommended
    cfg = _cfg(tmp_path)
    write_best(cfg, report, verdict)
    folder = StudyFolder(cfg.out_dir)
    best = _exec(_read(folder.best_sh))
    assert "--speculative-adaptive " in best
    beside = '"$(dirname -- "${BASH_SOURCE[0]}")/adaptive_tiers.json"'
    assert best.endswith(f'--speculative-adaptive-config {beside} "$@"')
    assert "export NCCL_PROTO=LL" in _read(folder.best_sh)  # the plan's NCCL set
    assert "verified by trial 2 at every load: recommended" in _read(folder.best_sh)
    static = _exec(_read(folder.best_static_sh))
    assert "--speculative-adaptive" not in static and "--speculative-num-steps 2" in static
    assert _read(folder.adaptive_tiers) == tiers_json(verdict.plan.tiers)
    assert not os.path.exists(folder.best_adaptive_sh)
    doc = yaml.safe_load(_read(folder.best_yaml))
    assert doc["best_sh"] == "per-load plan" and doc["plan"]["script"] == "best.sh"
    assert doc["plan"]["tiers"] == {"1": [2], "16": [0]} and doc["plan"]["verified_by"] == [2]


def test_a_plan_not_recommended_is_best_adaptive_sh_and_best_sh_the_static_pick(tmp_path) -> None:
    cfg = _cfg(tmp_path)
    write_best(cfg, *_verdict(96.0, 700.0))  # an earlier run recommended it
    report, verdict = _verdict(80.0, 500.0)  # slower everywhere
    assert not verdict.recommended
    write_best(cfg, report, verdict)
    folder = StudyFolder(cfg.out_dir)
    assert "--speculative-adaptive" not in _read(folder.best_sh)
    assert "best-adaptive.sh beside this file launches the per-load plan" in _read(folder.best_sh)
    plan = _read(folder.best_adaptive_sh)
    assert "--speculative-adaptive-config " in _exec(plan) and "not recommended" in plan
    assert not os.path.exists(folder.best_static_sh)  # the earlier run's option: gone
    assert json.loads(_read(folder.adaptive_tiers)) == {
        "1": {"candidate_steps": [2]}, "16": {"candidate_steps": [0]},
    }  # fmt: skip
    assert yaml.safe_load(_read(folder.best_yaml))["best_sh"] == "static pick"


def test_without_a_plan_only_best_sh(tmp_path) -> None:
    cfg = _cfg(tmp_path)
    report, verdict = _verdict(96.0, 700.0)
    write_best(cfg, report, verdict)
    write_best(cfg, report)  # a study with no plan (one load)
    folder = StudyFolder(cfg.out_dir)
    assert "--speculative-adaptive" not in _read(folder.best_sh)
    assert not os.path.exists(folder.best_static_sh)
    assert not os.path.exists(folder.best_adaptive_sh)


def test_a_plans_values_never_become_lines_of_its_script(tmp_path) -> None:
    report, verdict = _verdict(96.0, 700.0)
    plan = dataclasses.replace(verdict.plan, nccl_env=(("NCCL_PROTO", INJECTED),))
    cfg = _cfg(tmp_path)
    write_best(cfg, report, dataclasses.replace(verdict, plan=plan))
    script = _read(StudyFolder(cfg.out_dir).best_sh)
    lines = script.splitlines()
    assert not any(line.lstrip().startswith("touch") for line in lines), script
    check = subprocess.run(["bash", "-n", "-c", script], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
