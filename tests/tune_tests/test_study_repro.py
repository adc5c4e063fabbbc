"""A seeded twin study is reproducible: the same trials, pruning and pick on every run.

The twin is timed by its simulated clock (``BenchPlan.clock="twin"``), so the host's scheduling
jitter (two cores shared with the rest of the test suite) cannot move a measured number, a
pruning decision, a restart of a leader or the pick. About 50 s on two busy cores (two studies
of 4 restarts).
"""

from __future__ import annotations

import json
import math
from typing import Any

from rayspec._config import load_config
from rayspec.store import ParquetTrialStore
from rayspec.tune import run_study
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import free_port_block

SMALL = [
    "study.max_restarts=4",
    "bench.repeats=2",
    "bench.max_repeats=3",
    "bench.max_tokens=40",
    "server.twin.startup_s=0.2",
    "cluster.include_dashboard=false",
]
# What a run of the study decides and measures (times of day and paths left out).
_COLUMNS = (
    "trial", "state", "value", "candidate", "role", "reason", "repeat_of", "restart", "runs",
    "tok_s_mean", "tok_s_peak", "tok_s_std", "accept_length", "ttft_ms_p50", "failure", "params",
)  # fmt: skip


def _comparable(value: Any) -> Any:
    """NaN (no accept length without speculation) as None, so equal rows compare equal."""
    return None if isinstance(value, float) and math.isnan(value) else value


def _study(folder: str) -> tuple[list[dict[str, Any]], str]:
    cfg = load_config(
        TWIN_EXPERIMENT, [f"output.dir={folder}", f"server.port={free_port_block()}", *SMALL]
    )
    outcome = run_study(cfg, printer=lambda _line: None)
    rows = ParquetTrialStore(cfg.out_dir).load_trials().to_pylist()
    table = [{k: _comparable(row.get(k)) for k in _COLUMNS} for row in rows]
    table.sort(key=lambda r: r["trial"])
    best = outcome.report.best
    pick = (best.label, best.trials, best.tok_s_mean) if best is not None else None
    return table, json.dumps(pick)


def test_a_seeded_twin_study_gives_the_same_trials_and_pick(ray_cluster, tmp_path) -> None:
    first, pick = _study(str(tmp_path / "a"))
    second, pick_again = _study(str(tmp_path / "b"))
    assert len(first) == 4 and any(r["state"] == "COMPLETE" for r in first)
    for a, b in zip(first, second, strict=True):
        assert a == b, f"trial {a['trial']} differs between two runs of the same seeded study"
    assert pick == pick_again
