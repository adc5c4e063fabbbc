"""The study loop with the structured search, on simulated twin starts (no Ray, seconds).

The simulation is deterministic (seeded per trial), so these are exact replays, not samples.
"""

from __future__ import annotations

import os

import pytest

from rayspec._config import load_config
from rayspec.store import ParquetTrialStore
from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study
from rayspec.twin import PerfModel
from rayspec.twin import load_profile
from rayspec.twin import resolve_nccl
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import twin_doc
from tests.helpers import write_experiment

FIELD_PROTOCOL = ["bench.warmup=1", "bench.repeats=5", "bench.max_tokens=500"]
OPTIMUM = 99.82  # the quickstart space's best on the field profile: 2 steps, topk 4, 6 tokens


def _cfg(tmp_path, *extra: str):
    return load_config(TWIN_EXPERIMENT, [f"output.dir={tmp_path}", *FIELD_PROTOCOL, *extra])


def _true(candidate) -> float:
    profile = load_profile("kimi-k2.5-tp8-pcie")
    nccl = resolve_nccl(candidate.env, profile)
    return PerfModel(profile, nccl, candidate.spec).expected_tok_s()


@pytest.mark.parametrize("seed", [0, 1])
def test_the_structured_search_reaches_the_optimum(tmp_path, seed: int) -> None:
    lines: list[str] = []
    cfg = _cfg(tmp_path, f"study.seed={seed}", "study.max_restarts=20")
    outcome = run_study(cfg, trial_fn=SimulatedTrials(), printer=lines.append)
    best = outcome.report.best
    assert best is not None and best.candidate.spec is not None
    assert _true(best.candidate) >= 0.99 * OPTIMUM
    assert best.starts >= 2  # confirmed by a second server start before it is called best
    assert outcome.restarts <= 20
    rows = sorted(ParquetTrialStore(cfg.out_dir).load_trials().to_pylist(),
                  key=lambda r: r["trial"])  # fmt: skip
    assert rows[0]["role"] == "baseline" and rows[1]["role"] == "enqueued[0]"
    # NCCL came from the screen: every configuration the search chose runs the fastest set.
    chosen = [r for r in rows[2:] if r["reason"]]
    assert chosen and all(
        r["env"].count("NCCL_") == 3 and "SYS" in r["env"] and '"LL"' in r["env"] for r in chosen
    )  # NCCL_P2P_LEVEL, NCCL_PROTO, and the exported NCCL_NVLS_ENABLE=0
    assert os.path.exists(os.path.join(cfg.out_dir, "nccl_screen.json"))
    assert any("pick" in line and line.startswith("[restart ") for line in lines)


def _small(tmp_path, study: dict, search: dict):
    doc = twin_doc(str(tmp_path), study=study, search=search,
                   bench={"warmup": 1, "repeats": 3, "max_tokens": 100})  # fmt: skip
    doc["study"].pop("n_trials")
    doc["study"].update(study)
    return load_config(write_experiment(str(tmp_path), doc))


def test_reused_configurations_cost_no_restart(tmp_path) -> None:
    """A sampler that re-asks measured configurations reuses their result for free; the
    restart budget counts launches only."""
    cfg = _small(
        tmp_path, {"sampler": "random", "n_trials": 12},
        {"speculative": {"modes": ["off"]}, "nccl": {"NCCL_PROTO": ["LL"]}},
    )  # fmt: skip
    outcome = run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None)
    rows = ParquetTrialStore(cfg.out_dir).load_trials().to_pylist()
    assert len(rows) == 12 and outcome.restarts == 2  # unset and LL
    assert sum(1 for r in rows if r["note"]) == 10
    assert outcome.stopped.startswith("study.n_trials reached")


def test_a_failed_nccl_set_is_never_launched_again(tmp_path) -> None:
    """Random search has no screen: a launch with a bad NCCL value fails; the same set is never
    launched again, and once two failed sets share only that value, no set with it is."""
    cfg = _small(
        tmp_path, {"sampler": "random", "n_trials": 30},
        {"nccl": {"NCCL_PROTO": ["LL256"], "NCCL_ALGO": ["Ring", "Tree"]},
         "speculative": {"modes": ["off", "EAGLE3"], "num_steps": [1, 2], "eagle_topk": [1]}},
    )  # fmt: skip
    run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None)
    rows = ParquetTrialStore(cfg.out_dir).load_trials().to_pylist()
    bad = [r for r in rows if "LL256" in (r["env"] or "")]
    launched = [r for r in bad if r["command"] and not r["note"]]
    assert bad and all(r["failure"] == "nccl_init" for r in bad)
    assert len({r["env"] for r in launched}) == len(launched)  # never the same set twice
    assert len(launched) <= 3  # then the common cause, PROTO=LL256, is refused outright
    assert any("in every failed NCCL set" in (r["failure_detail"] or "") for r in bad)


def test_the_screen_keeps_a_bad_nccl_value_from_any_launch(tmp_path) -> None:
    cfg = _cfg(tmp_path, "study.max_restarts=6", "search.nccl={NCCL_PROTO: [LL, LL256]}")
    lines: list[str] = []
    run_study(cfg, trial_fn=SimulatedTrials(), printer=lines.append)
    rows = ParquetTrialStore(cfg.out_dir).load_trials().to_pylist()
    assert not any("LL256" in (r["env"] or "") for r in rows)
    assert any("failed or hung, never launched" in line for line in lines)


def test_the_wall_clock_budget_stops_new_trials(tmp_path) -> None:
    cfg = _cfg(tmp_path, "study.max_wall_s=0.001")
    outcome = run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None)
    assert outcome.stopped.startswith("study.max_wall_s")
    assert outcome.restarts <= 1


def test_without_a_screen_the_search_keeps_the_best_measured_nccl_set(tmp_path) -> None:
    """No screen (off, or none for the engine): NCCL is not searched; the search runs its
    speculative settings with the NCCL set of the best configuration so far (the enqueued
    hand-tuned one here), never with NCCL's slow defaults."""
    cfg = _cfg(tmp_path, "study.max_restarts=6", "search.nccl_screen.enabled=false")
    run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None)
    rows = sorted(ParquetTrialStore(cfg.out_dir).load_trials().to_pylist(),
                  key=lambda r: r["trial"])  # fmt: skip
    enqueued_env = rows[1]["env"]
    assert all(r["env"] == enqueued_env for r in rows[2:])
    assert not os.path.exists(os.path.join(cfg.out_dir, "nccl_screen.json"))
