"""A saved NCCL screen that is not a ranking of the study's sets (edited, damaged) is measured
again, with one line saying why: followed, the search launched sets it could not name, or
queued a set outside the space and stopped on a traceback (simulated trials, no Ray)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rayspec._config import load_config
from rayspec.screen import ScreenReport
from rayspec.store import ParquetTrialStore
from rayspec.store import StudyFolder
from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study
from tests.helpers import TWIN_EXPERIMENT


def _foreign_value(data: dict[str, Any]) -> None:
    for r in data["results"]:
        r["env"] = sorted([["NCCL_PROTO", "LL128"], *(kv for kv in r["env"]
                                                      if kv[0] != "NCCL_PROTO")])  # fmt: skip


def _unknown_variable(data: dict[str, Any]) -> None:
    data["results"][0]["env"] = [["NCCL_FOO", "1"]]  # the fastest, the others 10x slower
    for r in data["results"][1:]:
        r["latency_us"] = [[s, t * 10] for s, t in r["latency_us"]]


def _no_latency(data: dict[str, Any]) -> None:
    for r in data["results"]:
        r["latency_us"] = [[s, float("nan")] for s, _ in r["latency_us"]]


def _garbage(data: dict[str, Any]) -> None:
    data["results"] = "not a list"


@pytest.mark.parametrize(
    ("tamper", "why"),
    [
        (_foreign_value, "NCCL_PROTO=LL128 is not a choice of search.nccl"),
        (_unknown_variable, "NCCL_FOO=1 is not a choice of search.nccl"),
        (_no_latency, "has no positive latency at each of the study's message sizes"),
        (_garbage, "not a saved NCCL screen"),
    ],
)
def test_an_edited_screen_is_measured_again_and_the_search_launches_no_junk(
    tmp_path, tamper: Any, why: str
) -> None:
    cfg = load_config(TWIN_EXPERIMENT, [f"output.dir={tmp_path}", "study.max_restarts=2",
                                        "bench.repeats=2", "bench.max_tokens=40"])  # fmt: skip
    run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None)
    path = StudyFolder(cfg.out_dir).nccl_screen
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    tamper(data)  # the fingerprint left as it was
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh)
    more = load_config(TWIN_EXPERIMENT, [f"output.dir={tmp_path}", "study.max_restarts=8",
                                         "bench.repeats=2", "bench.max_tokens=40"])  # fmt: skip
    lines: list[str] = []
    run_study(more, trial_fn=SimulatedTrials(), printer=lines.append)
    said = [ln for ln in lines if "is not a ranking of this study's NCCL sets" in ln]
    assert len(said) == 1 and why in said[0] and said[0].endswith("measured again"), lines[:3]
    with open(path, encoding="utf-8") as fh:
        ScreenReport.from_json(fh.read())  # rewritten by the new screen
    rows = ParquetTrialStore(more.out_dir).trial_rows()
    first_starts = [r["candidate_key"] for r in rows if r["command"] and r["repeat_of"] is None]
    assert len(first_starts) == len(set(first_starts)), first_starts  # no set launched twice
    assert all("NCCL_FOO" not in (r["env"] or "") for r in rows)
