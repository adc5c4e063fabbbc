"""The correctness gate survives a resume: a baseline interrupted while it measures keeps its
role when it is tried again and runs before the enqueued trials, a retried enqueued trial keeps
its role, and a gate with no reference says so and never lets an unchecked trial be picked.

The trials are the twin's model in-process (:class:`rayspec.testing.SimulatedTrials`: the same
launches, outputs and LL128 corruption as the twin server, no Ray), so each study takes a second.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import yaml

from rayspec._config import load_config
from rayspec.store import ParquetTrialStore
from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import free_port_block

FAST = ["bench.repeats=2", "bench.max_tokens=40", "cluster.include_dashboard=false"]
LL128 = {
    "spec.mode": "EAGLE3", "spec.num_steps": 2, "spec.eagle_topk": 1,
    "nccl.NCCL_PROTO": "LL128", "nccl.NCCL_P2P_LEVEL": "SYS",
}  # fmt: skip


def _ll128_cfg(tmp_path, *extra: str):
    layer = tmp_path / "ll128.yaml"
    layer.write_text(yaml.safe_dump({
        "search": {"nccl": {"NCCL_PROTO": ["unset", "LL", "Simple", "LL128"]}},
        "study": {"enqueue": [LL128]},
    }))  # fmt: skip
    return load_config(TWIN_EXPERIMENT, [
        str(layer), f"output.dir={tmp_path}", f"server.port={free_port_block()}", *FAST, *extra,
    ])  # fmt: skip


def _ctrl_c_at(trial: int):
    sim = SimulatedTrials()

    def fn(cfg, number, candidate, **kwargs: Any):
        if number == trial:
            raise KeyboardInterrupt(f"Ctrl-C while trial {number} measured")
        return sim(cfg, number, candidate, **kwargs)

    return fn


def _rows(cfg) -> dict[int, dict[str, Any]]:
    return {r["trial"]: r for r in ParquetTrialStore(cfg.out_dir).load_trials().to_pylist()}


def _quiet(_line: str) -> None:
    pass


def test_ctrl_c_during_the_baseline_then_resume_still_fails_the_wrong_output(tmp_path) -> None:
    """The issue's reproduction: LL128 on the twin's PCIe ring is wrong_output after a
    Ctrl-C during the baseline and a resume, exactly as in a run without the Ctrl-C."""
    cfg = _ll128_cfg(tmp_path, "study.max_restarts=3")
    with pytest.raises(KeyboardInterrupt):
        run_study(cfg, printer=_quiet, trial_fn=_ctrl_c_at(0))
    lines: list[str] = []
    outcome = run_study(cfg, printer=lines.append, trial_fn=SimulatedTrials())
    rows = _rows(cfg)
    assert rows[0]["failure"] == "interrupted"
    # The baseline's retry ran first and kept its role; the enqueued trial was judged by it.
    retry = next(n for n, r in sorted(rows.items()) if n > 0 and r["role"] == "baseline")
    enq = next(n for n, r in rows.items() if r["role"] == "enqueued[0]")
    assert rows[retry]["start_unix_s"] < rows[enq]["start_unix_s"], (retry, enq)
    assert rows[enq]["failure"] == "wrong_output" and rows[enq]["state"] == "FAIL", rows[enq]
    assert rows[enq]["gate_compared"] >= 1
    for n, row in rows.items():
        if row["state"] == "COMPLETE" and n != retry:
            assert row["vs_baseline_ratio"] is not None, (n, row)
            assert row["gate_compared"] >= 1, (n, row)
    assert outcome.report.best is not None
    assert "PROTO=LL128" not in outcome.report.best.label


def test_a_retried_enqueued_trial_keeps_its_role(tmp_path) -> None:
    cfg = _ll128_cfg(tmp_path, "study.max_restarts=3")
    with pytest.raises(KeyboardInterrupt):
        run_study(cfg, printer=_quiet, trial_fn=_ctrl_c_at(1))
    run_study(cfg, printer=_quiet, trial_fn=SimulatedTrials())
    rows = _rows(cfg)
    assert rows[1]["failure"] == "interrupted"
    retry = next(n for n, r in sorted(rows.items()) if n > 1 and r["role"] == "enqueued[0]")
    assert rows[retry]["failure"] == "wrong_output", rows[retry]


def test_a_gate_without_its_reference_says_so_and_never_picks_the_unchecked(tmp_path) -> None:
    """The baseline's request rows lost (its outputs are the reference): the gate says so at
    start and on each trial it could not check, the row says so, and none of those is picked."""
    cfg = _ll128_cfg(tmp_path, "study.max_restarts=1")
    run_study(cfg, printer=_quiet, trial_fn=SimulatedTrials())  # the baseline only
    os.remove(os.path.join(cfg.out_dir, "requests", "trial-000000.parquet"))
    more = _ll128_cfg(tmp_path, "study.max_restarts=3")
    lines: list[str] = []
    outcome = run_study(more, printer=lines.append, trial_fn=SimulatedTrials())
    rows = _rows(more)
    assert any(
        line.startswith("correctness gate: the baseline's (trial 0) outputs are not in")
        for line in lines
    ), lines
    unchecked = [n for n, r in rows.items() if r["gate_unchecked"] == 1.0]
    assert 1 in unchecked and rows[1]["state"] == "COMPLETE"  # LL128: fast, wrong, unchecked
    assert "not compared by the correctness gate" in rows[1]["failure_detail"]
    assert "correctness gate: trial 1's outputs were not compared" in "\n".join(lines)
    assert outcome.report.best is not None
    assert not set(outcome.report.best.trials) & set(unchecked), outcome.report.best


class Killed(BaseException):
    """Stands for SIGKILL: unwinds past every ``except Exception``."""


def test_a_baseline_killed_while_its_parameters_were_set_is_retried_as_the_baseline(
    tmp_path, monkeypatch
) -> None:
    """Found by the chaos suite: the retry was queued with the few parameters the killed
    driver had set, the sampler filled in the rest at random, and that "baseline" (LL128 among
    them) became the gate's reference."""
    import optuna

    cfg = _ll128_cfg(tmp_path, "study.max_restarts=3", "study.sampler=random")
    real = optuna.Trial.suggest_categorical
    calls = []

    def suggest(self, name, choices):
        calls.append(name)
        if self.number == 0 and len(calls) == 2:
            raise Killed("killed while trial 0's parameters were set")
        return real(self, name, choices)

    monkeypatch.setattr(optuna.Trial, "suggest_categorical", suggest)
    with pytest.raises(Killed):
        run_study(cfg, printer=_quiet, trial_fn=SimulatedTrials())
    monkeypatch.undo()
    outcome = run_study(cfg, printer=_quiet, trial_fn=SimulatedTrials())
    rows = _rows(cfg)
    retry = next(n for n, r in sorted(rows.items()) if n > 0 and r["role"] == "baseline")
    assert rows[retry]["candidate"] == "no speculation; NCCL default", rows[retry]
    enq = next(n for n, r in rows.items() if r["role"] == "enqueued[0]")
    assert rows[enq]["failure"] == "wrong_output", rows[enq]
    assert "PROTO=LL128" not in outcome.report.best.label
