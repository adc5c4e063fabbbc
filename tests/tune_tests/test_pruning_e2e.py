"""Pruning on the twin: shorter, and the best configuration is not lost.

Two studies with the same seeded random sampler propose the same candidates; one prunes, the
other does not. Two scenarios run per trial (the objective's first), so the per-scenario
columns are checked on the way.
"""

from __future__ import annotations

from rayspec._config import load_config
from rayspec.store import ParquetTrialStore
from rayspec.tune import run_study
from tests.helpers import free_port_block
from tests.helpers import twin_doc
from tests.helpers import write_experiment


def _study(tmp_path, name: str, pruning: bool):
    doc = twin_doc(
        str(tmp_path),
        study={"name": name, "n_trials": 6, "sampler": "random", "seed": 7,
               "pruning": pruning, "enqueue": [
                   {"spec.mode": "EAGLE3", "spec.num_steps": 2, "spec.eagle_topk": 1,
                    "nccl.NCCL_PROTO": "LL"}]},
        server={"port": free_port_block(), "twin": {"startup_s": 0.2}},
        cluster={"include_dashboard": False},
        # NCCL_SHM_DISABLE=1 without P2P falls back to sockets (~28 tok/s): clearly worse.
        search={"nccl": {"NCCL_PROTO": ["LL"], "NCCL_SHM_DISABLE": ["1"]},
                "speculative": {"num_steps": [2], "eagle_topk": [1]}},
        bench={"repeats": 3, "warmup": 1, "scenarios": [
            {"name": "c1", "max_tokens": 50},
            {"name": "c2", "concurrency": 2, "requests_per_run": 2, "max_tokens": 30}]},
    )  # fmt: skip
    cfg = load_config(write_experiment(str(tmp_path), doc, f"{name}.yaml"))
    outcome = run_study(cfg, printer=lambda _s: None)
    rows = ParquetTrialStore(cfg.out_dir).load_trials().to_pylist()
    return outcome, {r["trial"]: r for r in rows}


def test_pruning_saves_time_and_keeps_the_best(ray_cluster, tmp_path) -> None:
    full, full_rows = _study(tmp_path, "full", pruning=False)
    pruned, pruned_rows = _study(tmp_path, "pruned", pruning=True)
    # The same candidates in the same order (seeded random sampler; outcomes do not steer it).
    assert [r["candidate"] for _, r in sorted(full_rows.items())] == [
        r["candidate"] for _, r in sorted(pruned_rows.items())
    ]
    assert full.pruned == 0 and pruned.pruned >= 1
    assert pruned.bench_s_saved > 0 and pruned.report.bench_s_saved > 0
    assert all(r["state"] != "PRUNED" for r in full_rows.values())
    # The baseline (trial 0) and the enqueued configuration (trial 1) are measured in full.
    assert pruned_rows[0]["state"] == "COMPLETE" and pruned_rows[1]["state"] == "COMPLETE"
    # The best configuration of the unpruned study was not pruned away.
    best = full.report.fastest
    assert best is not None
    assert pruned_rows[best.trial]["state"] == "COMPLETE"
    # Every scenario's metrics are in the trial rows; pruned trials stop before the second.
    for row in full_rows.values():
        if row["state"] == "COMPLETE" and not row["note"]:
            assert row["c2__tok_s_mean"] > row["tok_s_mean"] * 0.5  # two streams at once
    assert {sc for sc, _ in full.report.best_per_scenario} == {"c2"}
