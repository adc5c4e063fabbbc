"""A study that meets a failure no later trial gets past says so and stops (exit 1); a failed
new start of a measured configuration is retried once, then the search moves on; nothing junk
is recorded (simulated trials, no Ray)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rayspec._config import ExperimentConfig
from rayspec._config import load_config
from rayspec._exceptions import FailureReason
from rayspec._types import Candidate
from rayspec._types import LaunchSpec
from rayspec._types import SpecSettings
from rayspec._types import TrialResult
from rayspec.search import Strategy
from rayspec.search import canonical_key
from rayspec.store import ParquetTrialStore
from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study
from rayspec.tune._trial import failed_result
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import free_port_block


def _cfg(tmp_path: Any, *more: str) -> ExperimentConfig:
    return load_config(TWIN_EXPERIMENT, [f"output.dir={tmp_path}", *more])


class _KilledStarts:
    """SimulatedTrials whose ``kill`` numbered starts of a configuration (1: its first, 2: its
    second ...) are killed from outside: the server dies mid-benchmark."""

    def __init__(self, kill: set[int], reason: FailureReason) -> None:
        self._sim = SimulatedTrials()
        self.kill = kill
        self.reason = reason
        self.starts: Counter[str] = Counter()
        self.killed: list[int] = []

    def __call__(self, cfg: Any, number: int, candidate: Candidate, **kw: Any) -> TrialResult:
        key = canonical_key(candidate)
        self.starts[key] += 1
        result = self._sim(cfg, number, candidate, **kw)
        if self.starts[key] not in self.kill:
            return result
        self.killed.append(number)
        return failed_result(
            number, candidate, self.reason, "the server was killed from outside (test)",
            launch=result.launch, node="simulated",
            log_tail="[2026-01-02 10:00:00] Received sigquit from a child process.",
        )  # fmt: skip


def _junk(cfg: ExperimentConfig) -> list[dict[str, Any]]:
    """Rows that are no measurement of anything: a failure reused without a launch."""
    rows = ParquetTrialStore(cfg.out_dir).trial_rows()
    return [r for r in rows if r["state"] == "FAIL" and not r["command"]]


def test_a_killed_second_start_is_retried_once_and_the_study_goes_on(tmp_path) -> None:
    """The quickstart with the first new start of a configuration ("confirm the best") killed
    from outside: the old search asked for that start 200 times more, each a reused FAIL, and
    stopped with exit code 0; now it starts it again and goes on to its own stop."""
    cfg = _cfg(tmp_path)
    trials = _KilledStarts({2}, FailureReason.CRASH_MID_BENCHMARK)
    outcome = run_study(cfg, trial_fn=trials, printer=lambda _line: None)
    assert trials.killed, "no configuration was started twice"
    rows = {r["trial"]: r for r in ParquetTrialStore(cfg.out_dir).trial_rows()}
    killed = rows[trials.killed[0]]
    retried = [r for r in rows.values() if r["trial"] > killed["trial"]
               and r["candidate_key"] == killed["candidate_key"] and r["command"]]  # fmt: skip
    assert retried and retried[0]["state"] == "COMPLETE", "the killed start was not retried"
    assert not _junk(cfg) and not outcome.stuck
    assert outcome.ran <= cfg.study.max_restarts and outcome.stopped.startswith(
        ("converged", "restart budget spent")
    ), outcome.stopped


def test_a_configuration_whose_new_starts_fail_twice_is_left_and_the_search_goes_on(
    tmp_path,
) -> None:
    cfg = _cfg(tmp_path)
    trials = _KilledStarts({2, 3}, FailureReason.STARTUP_CRASH)
    outcome = run_study(cfg, trial_fn=trials, printer=lambda _line: None)
    rows = ParquetTrialStore(cfg.out_dir).trial_rows()
    first = next(r for r in rows if r["trial"] == trials.killed[0])
    starts = [r for r in rows if r["candidate_key"] == first["candidate_key"]]
    # Measured once, then two failed starts: never asked for again, nothing reused.
    assert [r["state"] for r in starts] == ["COMPLETE", "FAIL", "FAIL"], starts
    assert not _junk(cfg) and not outcome.stuck
    assert outcome.ran <= cfg.study.max_restarts
    assert "keeps proposing" not in outcome.stopped, outcome.stopped


class _AsksTheImpossible(Strategy):
    """Asks again and again for a new start of trial 0's configuration with a draft tree too
    large for SGLang (refused before launch): a strategy that cannot see the refusal."""

    def ask(self, study: Any, observations: Any, running: Any) -> Any:
        tree = Candidate(spec=SpecSettings("EAGLE3", 1, 2, 8))
        return study.ask(tree, reason="again", repeat_of=0)


def test_a_search_asking_for_a_start_that_cannot_happen_stops_at_once(tmp_path) -> None:
    cfg = _cfg(tmp_path, "study.max_restarts=4")
    outcome = run_study(
        cfg, trial_fn=SimulatedTrials(), strategy=_AsksTheImpossible(),
        printer=lambda _line: None,
    )  # fmt: skip
    rows = ParquetTrialStore(cfg.out_dir).trial_rows()
    assert outcome.stuck and "cannot start" in outcome.stopped, outcome.stopped
    assert len(rows) == 3, [r["failure_detail"] for r in rows]  # the two floors, one refusal


_LAUNCH = LaunchSpec(
    argv=("python",), env=(), host="127.0.0.1", port=1, log_path="-", startup_timeout_s=1.0,
    engine="sglang",
)  # fmt: skip


def _crashes(log: str) -> Any:
    def trial_fn(cfg: Any, number: int, candidate: Candidate, **kw: Any) -> TrialResult:
        return failed_result(
            number, candidate, FailureReason.STARTUP_CRASH,
            "sglang server exited before it became ready (returncode 1, startup_crash)",
            launch=_LAUNCH, log_tail=log.format(n=number),
        )  # fmt: skip

    return trial_fn


BROKEN = (
    "[2026-01-02 10:00:0{n}] server_args=ServerArgs(...)\n"
    "Traceback (most recent call last):\n"
    '  File "/opt/sglang/lib/python3.11/site-packages/sgl_kernel/__init__.py", line 5\n'
    "    from sgl_kernel import common_ops\n"
    "ModuleNotFoundError: No module named 'sgl_kernel.common_ops'\n"
    "[2026-01-02 10:00:0{n}] Received sigquit from a child process. It usually means the child "
    "failed.\n"
)


def test_a_broken_install_stops_the_study_after_two_launches_with_its_cause(tmp_path) -> None:
    """Every launch crashes the same way (the old study spent all 14 restarts, then said
    "converged"): the second such launch stops it, with the log's own line."""
    cfg = _cfg(tmp_path)
    outcome = run_study(cfg, trial_fn=_crashes(BROKEN), printer=lambda _line: None)
    assert outcome.restarts == 2 and outcome.stuck
    assert "ModuleNotFoundError: No module named 'sgl_kernel.common_ops'" in outcome.stopped
    assert outcome.stopped.startswith("trials 0 and 1 failed the same way"), outcome.stopped


def test_startup_failures_of_different_causes_do_not_stop_the_study() -> None:
    from rayspec.tune._halt import SameStartupFailure
    from rayspec.tune._halt import cause_line

    watch = SameStartupFailure("logs")

    def crash(n: int, line: str, reason: FailureReason = FailureReason.STARTUP_CRASH) -> str:
        cand = Candidate(spec=SpecSettings("EAGLE3", 1 + n % 2, 1, 2 + n % 2))
        result = failed_result(n, cand, reason, "exited", launch=_LAUNCH, log_tail=line)
        return watch.see(result)

    assert crash(0, "RuntimeError: CUDA error: an illegal memory access") == ""
    assert crash(1, "RuntimeError: draft model has no lm_head") == ""
    oom = "torch.OutOfMemoryError: CUDA out of memory"
    assert crash(2, oom, FailureReason.OUT_OF_MEMORY) == ""  # a smaller one may fit
    assert crash(3, oom, FailureReason.OUT_OF_MEMORY) == ""
    assert crash(4, "[2026-01-02 10:00:00 TP0] usage: launch_server.py: error: bad flag") == ""
    assert crash(5, "[2026-01-02 10:00:09 TP0] usage: launch_server.py: error: bad flag")
    assert crash(6, "RuntimeError: x") == "" and crash(8, "RuntimeError: x") == ""  # one config
    never = "sglang server not ready within 60 s (never_ready)"
    waited = failed_result(9, Candidate(), FailureReason.NEVER_READY, never, log_tail="[t] x")
    assert cause_line(waited) == never  # the wait, not the log's last line
    # The cause line: the last exception of a traceback, without the log's own stamp.
    tail = BROKEN.format(n=3)
    result = failed_result(7, Candidate(), FailureReason.STARTUP_CRASH, "x", log_tail=tail)
    assert cause_line(result) == "ModuleNotFoundError: No module named 'sgl_kernel.common_ops'"


def test_the_command_line_exits_1_with_the_cause_of_a_broken_install(
    tmp_path, capsys, monkeypatch
) -> None:
    import rayspec.tune._driver as driver
    from rayspec.tune.__main__ import main
    from rayspec.tune._cluster import ClusterHandle

    real = driver.run_study
    monkeypatch.setattr(driver, "run_study", lambda cfg, **kw: real(
        cfg, **{**kw, "slots": 1, "trial_fn": _crashes(BROKEN)}))  # fmt: skip
    handle = ClusterHandle(address="local", local=True, gpus=8, slots=1, dashboard_url="")
    monkeypatch.setattr("rayspec.tune._cluster.connect", lambda *_a, **_k: handle)
    monkeypatch.setattr("rayspec.tune._cluster.disconnect", lambda *_a, **_k: None)
    code = main([TWIN_EXPERIMENT, f"output.dir={tmp_path}", f"server.port={free_port_block()}",
                 "cluster.include_dashboard=false"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1].startswith("error: the study cannot go on: trials 0 and 1 failed the same"), err
    assert "No module named 'sgl_kernel.common_ops'" in err[-1]


def test_an_unreachable_slo_says_that_trials_ran_and_none_met_it(
    tmp_path, capsys, monkeypatch
) -> None:
    import rayspec.tune._driver as driver
    from rayspec.tune.__main__ import main
    from rayspec.tune._cluster import ClusterHandle

    real = driver.run_study
    monkeypatch.setattr(driver, "run_study", lambda cfg, **kw: real(
        cfg, **{**kw, "slots": 1, "trial_fn": SimulatedTrials()}))  # fmt: skip
    handle = ClusterHandle(address="local", local=True, gpus=8, slots=1, dashboard_url="")
    monkeypatch.setattr("rayspec.tune._cluster.connect", lambda *_a, **_k: handle)
    monkeypatch.setattr("rayspec.tune._cluster.disconnect", lambda *_a, **_k: None)
    code = main([TWIN_EXPERIMENT, f"output.dir={tmp_path}", f"server.port={free_port_block()}",
                 "cluster.include_dashboard=false", "study.max_restarts=3",
                 "study.objective=goodput", "study.slo.ttft_p99_ms=0.01", "bench.repeats=1",
                 "bench.max_repeats=1", "bench.max_tokens=20"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 1
    assert "no trial completed" not in out
    assert "no configuration picked: 3 trials ran to the end (0 failed), but no request" in out
    assert "study.slo (ttft_p99_ms 0.01)" in out
