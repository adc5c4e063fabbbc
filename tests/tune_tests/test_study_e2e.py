"""The main job end to end on the twin: Ray actors, Optuna, Parquet, best.yaml/best.sh."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rayspec._config import load_config
from rayspec.results import write_best
from rayspec.store import ParquetTrialStore
from rayspec.tune import run_study
from tests.helpers import REPO
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import free_port_block

FAST = [
    "bench.repeats=2",
    "bench.max_tokens=40",
    "server.twin.startup_s=0.2",
    "cluster.include_dashboard=false",
]


def _cfg(tmp_path, *extra: str):
    port = f"server.port={free_port_block()}"
    return load_config(TWIN_EXPERIMENT, [f"output.dir={tmp_path}", port, *FAST, *extra])


def test_study_runs_resumes_and_writes_everything(ray_cluster, tmp_path) -> None:
    lines: list[str] = []
    cfg = _cfg(tmp_path, "study.max_restarts=4")
    outcome = run_study(cfg, printer=lines.append)
    assert outcome.ran == 4 and outcome.restarts == 4
    store = ParquetTrialStore(cfg.out_dir)
    rows = {r["trial"]: r for r in store.load_trials().to_pylist()}
    assert sorted(rows) == [0, 1, 2, 3]
    for row in rows.values():
        assert row["state"] in ("COMPLETE", "FAIL", "PRUNED")
        if row["state"] == "COMPLETE" and not row["note"]:
            assert row["value"] > 0 and row["tok_s_peak"] >= row["tok_s_mean"]
            assert json.loads(row["command"])[1:3] == ["-m", "rayspec.twin.server"]
            assert row["engine"] == "twin"
    # The baseline first, the hand-tuned field configuration second.
    assert rows[0]["candidate"] == "no speculation; NCCL default"
    assert rows[1]["spec_num_steps"] == 2 and rows[1]["spec_num_draft_tokens"] == 3
    assert 1.2 < rows[1]["accept_length"] < 2.6  # run-scoped, from meta_info
    assert rows[1]["value"] > rows[0]["value"]  # the field's finding, on the twin
    requests = store.load_requests().to_pylist()
    assert {r["trial"] for r in requests} >= {0, 1}
    assert all(r["completion_tokens"] == 40 for r in requests if r["error"] is None)
    # The NCCL screen ran before the first restart; progress lines say restarts used of the
    # budget, why the search chose the configuration, and the pick so far.
    assert any(
        line.startswith("NCCL screen: ") and "fastest: P2P_LEVEL=SYS PROTO=LL" in line
        for line in lines
    )
    assert os.path.exists(os.path.join(cfg.out_dir, "nccl_screen.json"))
    assert any(line.startswith("[restart 4/4] trial 3 (") and "pick" in line for line in lines)
    assert rows[2]["reason"] and rows[2]["restart"] == 3.0
    # The end: best.yaml and best.sh.
    paths = write_best(cfg, outcome.report)
    assert paths is not None
    script = open(paths[1]).read()
    assert "python -m sglang.launch_server" in script and "DIGITAL TWIN" in script
    assert os.access(paths[1], os.X_OK)
    # Logs of every launched trial.
    assert os.path.exists(os.path.join(cfg.out_dir, "logs", "trial-000000.log"))

    # Resume: the same study with a larger budget adds exactly the difference in restarts.
    more = _cfg(tmp_path, "study.max_restarts=6")
    outcome2 = run_study(more, printer=lines.append)
    assert outcome2.resumed_from == 4 and outcome2.ran == 2 and outcome2.restarts == 6
    assert sorted(store.trial_numbers()) == [0, 1, 2, 3, 4, 5]
    assert any(line.startswith("NCCL screen: ") and ", from " in line for line in lines)
    # And with the budget already spent, nothing runs.
    assert run_study(more, printer=lines.append).ran == 0


def test_cli_runs_a_small_study(tmp_path) -> None:
    """`python -m rayspec.tune` itself: its own local Ray, exit 0, the table, best files."""
    proc = subprocess.run(
        [sys.executable, "-m", "rayspec.tune", TWIN_EXPERIMENT, f"output.dir={tmp_path}",
         "study.max_restarts=2", f"server.port={free_port_block()}",
         f"cluster.dashboard_port={free_port_block(1)}", *FAST],
        capture_output=True, text=True, cwd=REPO, timeout=240,
        env={**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| trials | config | tok/s | tok/s peak |" in proc.stdout
    assert "(baseline)" in proc.stdout
    assert "SIMULATED" in proc.stdout
    out = os.path.join(tmp_path, "eagle3-twin")
    assert os.path.exists(os.path.join(out, "best.sh"))
    assert os.path.exists(os.path.join(out, "best.yaml"))


@pytest.mark.parametrize("fault", ["crash-startup"])
def test_a_failed_trial_is_recorded_and_the_study_goes_on(ray_cluster, tmp_path, fault) -> None:
    cfg = _cfg(tmp_path, "study.max_restarts=2", f"server.twin.fault={fault}")
    outcome = run_study(cfg, printer=lambda _s: None)
    rows = ParquetTrialStore(cfg.out_dir).load_trials().to_pylist()
    assert outcome.ran == 2 and len(rows) == 2
    assert all(r["state"] == "FAIL" for r in rows)
    assert all(r["failure"] == "startup_crash" for r in rows)
    assert all("Scheduler hit an exception" in (r["log_tail"] or "") for r in rows)


def test_a_fast_wrong_answer_fails_the_gate_and_is_never_picked(ray_cluster, tmp_path) -> None:
    """LL128 forced on the PCIe twin corrupts its outputs: the trial is wrong_output in the
    table and Parquet, and the pick is a correct configuration."""
    import yaml

    from rayspec.tune._report import format_table

    layer = tmp_path / "ll128.yaml"
    layer.write_text(yaml.safe_dump({
        "search": {"nccl": {"NCCL_PROTO": ["unset", "LL", "Simple", "LL128"]}},
        "study": {"enqueue": [
            {"spec.mode": "EAGLE3", "spec.num_steps": 2, "spec.eagle_topk": 1,
             "nccl.NCCL_PROTO": "LL128", "nccl.NCCL_P2P_LEVEL": "SYS"},
        ]},
    }))  # fmt: skip
    cfg = load_config(TWIN_EXPERIMENT, [
        str(layer), f"output.dir={tmp_path}", f"server.port={free_port_block()}", *FAST,
        "study.max_restarts=3",
    ])  # fmt: skip
    outcome = run_study(cfg, printer=lambda _s: None)
    rows = {r["trial"]: r for r in ParquetTrialStore(cfg.out_dir).load_trials().to_pylist()}
    assert rows[1]["failure"] == "wrong_output" and rows[1]["state"] == "FAIL"
    assert "differ from the baseline's" in rows[1]["failure_detail"]
    assert rows[1]["tok_s_mean"] > 0  # measured, fast, and wrong
    assert rows[2]["failure"] is None and rows[2]["gate_compared"] >= 1
    assert "PROTO=LL128" not in outcome.report.best.label
    assert "failed: wrong_output" in format_table(outcome.report)


def test_a_drafter_on_the_wrong_layers_raises_the_acceptance_alarm(ray_cluster, tmp_path) -> None:
    """Outputs stay correct (the target verifies), acceptance collapses: flagged with a hint."""
    lines: list[str] = []
    cfg = _cfg(tmp_path, "study.max_restarts=2", "study.expect_accept_length=1.9",
               "server.extra_flags=[--twin-fault,draft-layers:0.3]")  # fmt: skip
    run_study(cfg, printer=lines.append)
    rows = {r["trial"]: r for r in ParquetTrialStore(cfg.out_dir).load_trials().to_pylist()}
    assert rows[1]["state"] == "COMPLETE" and rows[1]["failure"] is None  # not wrong output
    assert "hidden-state layer wiring" in rows[1]["alarm"]
    assert any(line.startswith("  acceptance alarm: accept length") for line in lines)
