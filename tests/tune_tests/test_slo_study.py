"""study.slo in a study on simulated twin starts (no Ray): the constraint reaches Optuna, and
the pick meets the SLO whenever some configuration did.

The simulated server is wrapped so that every speculative configuration answers its first
token ``LATE_MS`` later: with a TTFT limit between the two, only configurations without
speculation meet it, while speculation stays faster in tok/s, so a pick by throughput alone
would be an infeasible one.
"""

from __future__ import annotations

import dataclasses

import optuna
import pytest

from rayspec._config import load_config
from rayspec.search._study import CONSTRAINT_SLO
from rayspec.store import ParquetTrialStore
from rayspec.testing import SimulatedTrials
from rayspec.testing import _simtrial
from rayspec.tune import run_study
from rayspec.twin._simulate import SimulatedRequest
from rayspec.twin._simulate import SimulatedServer
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import twin_doc
from tests.helpers import write_experiment

LATE_MS = 60.0  # the simulated TTFT is about 50 ms; speculation gains far more than 60 ms
PROTOCOL = ["bench.warmup=1", "bench.repeats=3", "bench.max_tokens=100"]


class _LateWhenSpeculative(SimulatedServer):
    def generate(self, *args, **kwargs) -> SimulatedRequest:  # type: ignore[no-untyped-def]
        r = super().generate(*args, **kwargs)
        if not self.speculative:
            return r
        return dataclasses.replace(r, ttft_ms=r.ttft_ms + LATE_MS, e2e_ms=r.e2e_ms + LATE_MS)

    @property
    def speculative(self) -> bool:
        return self.spec is not None


@pytest.fixture
def late_speculation(monkeypatch):
    monkeypatch.setattr(_simtrial, "SimulatedServer", _LateWhenSpeculative)


def _cfg(tmp_path, *extra: str):
    return load_config(TWIN_EXPERIMENT, [f"output.dir={tmp_path}", *PROTOCOL, *extra])


def _optuna_trials(cfg) -> list[optuna.trial.FrozenTrial]:
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(cfg.storage_url)
    )
    return optuna.load_study(study_name=cfg.study.name, storage=storage).trials


def test_a_tpe_study_tells_optuna_the_slo_constraint(tmp_path, late_speculation) -> None:
    cfg = _cfg(tmp_path, "study.sampler=tpe", "study.max_restarts=6", "study.n_startup_trials=3",
               "study.slo.ttft_p99_ms=80", "study.objective=goodput")  # fmt: skip
    run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None)
    rows = {r["trial"]: r for r in ParquetTrialStore(cfg.out_dir).load_trials().to_pylist()}
    measured = [t for t in _optuna_trials(cfg) if t.state.name in ("COMPLETE", "PRUNED")
                and rows[t.number]["state"] != "FAIL"]  # fmt: skip
    assert measured
    for t in measured:
        assert t.constraints[CONSTRAINT_SLO] == pytest.approx(rows[t.number]["slo_violation"])
        assert optuna.samplers._tpe.sampler._get_infeasible_trial_score(t) > 0 or (
            rows[t.number]["slo_violation"] <= 0
        )
    feasible = {rows[t.number]["slo_violation"] <= 0 for t in measured}
    assert feasible == {True, False}  # the limit splits the configurations


@pytest.mark.parametrize("objective", ["goodput", "tok_s_mean"])
def test_the_pick_meets_the_slo_when_a_configuration_did(tmp_path, late_speculation,
                                                         objective: str) -> None:  # fmt: skip
    cfg = _cfg(tmp_path, "study.max_restarts=8", "study.slo.ttft_p99_ms=80",
               f"study.objective={objective}")  # fmt: skip
    outcome = run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None)
    rows = ParquetTrialStore(cfg.out_dir).load_trials().to_pylist()
    fastest = max((r for r in rows if r["state"] == "COMPLETE"), key=lambda r: r["tok_s_mean"])
    assert fastest["slo_violation"] > 0  # by throughput alone, the pick would miss the SLO
    best = outcome.report.best
    assert best is not None and best.feasible and best.candidate.spec is None
    picked = [r for r in rows if r["trial"] in best.trials]
    assert all(r["slo_violation"] <= 0 for r in picked)
    # A configuration measured to goodput 0 counts as tried: the search does not re-ask it
    # (reused for free) until it gives up, it goes on to the next.
    assert len(rows) <= outcome.restarts + 2, outcome.stopped


def test_with_no_feasible_configuration_the_report_says_so(tmp_path, late_speculation) -> None:
    cfg = _cfg(tmp_path, "study.max_restarts=4", "study.slo.ttft_p99_ms=1")
    outcome = run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None)
    assert outcome.report.best is not None and not outcome.report.best.feasible
    assert "no configuration met study.slo" in outcome.report.pick_note


def test_a_reused_measurement_carries_its_constraint(tmp_path) -> None:
    """A sampler re-asking a measured configuration reuses it (no restart): the reuse is told
    to Optuna with the same SLO constraint, so it cannot look feasible."""
    doc = twin_doc(
        str(tmp_path),
        bench={"warmup": 1, "repeats": 2, "max_tokens": 50},
        search={"speculative": {"modes": ["off"]}, "nccl": {"NCCL_PROTO": ["LL"]}},
    )
    doc["study"].update({"sampler": "random", "n_trials": 6, "slo": {"ttft_p99_ms": 1.0}})
    cfg = load_config(write_experiment(str(tmp_path), doc))  # fmt: skip
    outcome = run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None)
    assert outcome.restarts == 2
    rows = {r["trial"]: r for r in ParquetTrialStore(cfg.out_dir).load_trials().to_pylist()}
    reused = [n for n, r in rows.items() if r["note"]]
    assert reused
    trials = {t.number: t for t in _optuna_trials(cfg)}
    for n in reused:
        assert trials[n].constraints[CONSTRAINT_SLO] > 0
