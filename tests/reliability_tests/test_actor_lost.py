"""A killed Ray worker of the server actor (its node alive) is not the configuration's failure:
``actor_lost``, tried again once with its role, no restart charged. Found by the chaos suite:
it was ``unknown`` (a configuration failure), and during the baseline it left the correctness
gate without a reference and the study without a pick."""

from __future__ import annotations

import os
import signal
from typing import Any

from rayspec.store import ParquetTrialStore
from rayspec.tune import run_study
from rayspec.tune._trial import run_trial
from tests.reliability_tests._support import descendants
from tests.reliability_tests._support import processes_with
from tests.reliability_tests._support import twin_cfg


def test_a_killed_server_actor_is_retried_and_the_baseline_keeps_its_role(
    ray_cluster, tmp_path
) -> None:
    killed: list[int] = []

    def trial_fn(cfg, number, candidate, *, on_phase=None, **kwargs: Any):
        def phase(n: int, what: str) -> None:
            if n == 0 and what == "benchmarking" and not killed:
                # This session's own actors only (the machine is shared).
                for pid in set(processes_with("ray::ServerActor")) & descendants():
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            if on_phase is not None:
                on_phase(n, what)

        return run_trial(cfg, number, candidate, on_phase=phase, **kwargs)

    cfg = twin_cfg(str(tmp_path), "study.max_restarts=2", "server.twin.startup_s=0.2",
                   "bench.max_tokens=200")  # fmt: skip
    lines: list[str] = []
    outcome = run_study(cfg, printer=lines.append, trial_fn=trial_fn)
    assert killed, "no server actor was found to kill"
    rows = {r["trial"]: r for r in ParquetTrialStore(cfg.out_dir).load_trials().to_pylist()}
    assert rows[0]["failure"] == "actor_lost", rows[0]
    retry = next(n for n, r in rows.items() if n > 0 and r["role"] == "baseline")
    assert rows[retry]["state"] == "COMPLETE"
    assert outcome.restarts == 2  # the lost launch was not charged
    assert any("its server actor's worker died" in line for line in lines), lines
    assert outcome.report.best is not None
