"""Nothing orphaned: no server process, and no child of it, outlives its trial, whatever ends it.

- ``ray.kill`` of a ServerActor, with its server ready or still starting;
- Ctrl-C (SIGINT), SIGTERM and SIGKILL of the driver, ``python -m rayspec.tune`` in its own
  session, sent while a trial's server is benchmarking (seen from the driver's progress lines).

The driver runs joined to the session's Ray cluster (``cluster.address``), so it starts in a
second rather than starting Ray each time; one more SIGKILL test runs the default set-up, a
private local Ray owned by the driver.
"""

from __future__ import annotations

import os
import re
import signal
import sys
from dataclasses import dataclass

import pytest

from rayspec._types import LaunchSpec
from tests.helpers import free_port
from tests.reliability_tests._support import Driver
from tests.reliability_tests._support import experiment
from tests.reliability_tests._support import kill_leftovers
from tests.reliability_tests._support import processes_with
from tests.reliability_tests._support import wait_no_processes

# Long enough (about a minute at the twin's rate) that a driver which waits for the trial
# instead of stopping it is caught by the deadlines below.
LONG_BENCH = {"max_tokens": 3000, "repeats": 1, "read_timeout_s": 30}
GONE_WITHIN_S = 15.0


def _twin_launch(tmp_path, port: int, *extra: str) -> LaunchSpec:
    argv = (
        sys.executable, "-m", "rayspec.twin.server",
        "--model-path", "rayspec-twin/kimi-k2.5-tp8-pcie", "--tp-size", "8",
        "--host", "127.0.0.1", "--port", str(port), "--twin-startup-s", "0.2", *extra,
    )  # fmt: skip
    return LaunchSpec(
        argv=argv, env=(), host="127.0.0.1", port=port,
        log_path=str(tmp_path / f"server-{port}.log"), startup_timeout_s=30.0, engine="twin",
    )  # fmt: skip


@pytest.mark.parametrize("when", ["ready", "starting"])
def test_ray_kill_of_the_server_actor_leaves_nothing(ray_cluster, tmp_path, when) -> None:
    import ray

    from rayspec.server import ServerActor

    port = free_port()
    extra = ("--twin-fault", "never-ready") if when == "starting" else ()
    launch = _twin_launch(tmp_path, port, *extra)
    needles = (f"--port {port} ", launch.log_path)
    actor = ServerActor.options(num_gpus=8).remote(grace_s=3.0)
    try:
        ray.get(actor.start.remote(launch), timeout=60)
        if when == "ready":
            ray.get(actor.wait_ready.remote(), timeout=60)
        else:
            actor.wait_ready.remote()  # in progress when the actor is killed
        tree = ray.get(actor.pids.remote(), timeout=30)
        assert len(tree) >= 2  # the reaper and the server
        assert set(tree) <= set(processes_with(*needles))
        ray.kill(actor)
        assert wait_no_processes(*needles, timeout_s=GONE_WITHIN_S) == {}
    finally:
        ray.kill(actor)
        kill_leftovers(*needles)


# -- the driver, signalled -----------------------------------------------------------------


@dataclass
class SignalRun:
    code: int | None  # None: still running at the deadline
    survivors: dict[int, str]
    output: str


_RUNS: dict[str, SignalRun] = {}


def _signal_driver(tmp_path_factory, how: str, cluster: dict[str, str]) -> SignalRun:
    """Start a study, wait for the phase, send the signal, and watch what is left.

    ``how`` is a signal name, optionally ``@starting``: sent while trial 0 waits for a server
    that never becomes ready (else while it benchmarks).
    """
    name, _, when = how.partition("@")
    port = free_port()
    folder = str(tmp_path_factory.mktemp(f"signal-{name.lower()}-{when or 'bench'}"))
    server = {"startup_timeout_s": 120, "twin": {"startup_s": 0.2, "fault": "never-ready"}}
    path = experiment(
        folder, name="sig", port=port, n_trials=3, bench=LONG_BENCH, cluster=cluster,
        server=server if when == "starting" else None,
    )  # fmt: skip
    phase = "waiting for ready" if when == "starting" else "benchmarking"
    needles = (os.path.join(folder, "sig"), f"--port {port} ")
    driver = Driver([path])
    try:
        line = driver.wait_for(rf"\[trial 0\] {phase}", timeout_s=150)
        assert line is not None, driver.output()
        assert processes_with(*needles), f"no server found while {phase}"
        driver.signal(getattr(signal, name))
        survivors = wait_no_processes(*needles, timeout_s=GONE_WITHIN_S)
        code = driver.wait(timeout_s=5.0 if survivors else GONE_WITHIN_S)
        return SignalRun(code, survivors, driver.output())
    finally:
        driver.kill_session()
        kill_leftovers(*needles)


@pytest.fixture(scope="module")
def signalled(ray_cluster, tmp_path_factory):
    """Run each signal once per module (both tests of a signal share the run)."""
    import ray

    address = ray.get_runtime_context().gcs_address

    def run(how: str) -> SignalRun:
        if how not in _RUNS:
            _RUNS[how] = _signal_driver(tmp_path_factory, how, {"address": address})
        return _RUNS[how]

    return run


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "SIGKILL", "SIGINT@starting"])
def test_no_server_survives_a_signalled_driver(signalled, how) -> None:
    run = signalled(how)
    assert run.survivors == {}, f"alive {GONE_WITHIN_S:g} s after {how}: {run.survivors}"
    assert run.code is not None, f"the driver still runs after {how}:\n{run.output}"


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM", "SIGINT@starting"])
def test_an_interrupted_driver_says_so_and_exits_130(signalled, how) -> None:
    run = signalled(how)
    assert run.code == 130, f"exit {run.code}:\n{run.output}"
    assert "interrupted: servers stopped" in run.output
    # One clean line, not Ray's text about the actors the driver killed on the way out: every
    # line is one of the driver's own (timestamped).
    for line in run.output.splitlines():
        assert re.match(r"\d\d:\d\d:\d\d ", line), run.output


def test_sigkill_of_a_driver_with_its_own_local_ray(tmp_path) -> None:
    """The default set-up: the driver starts a private Ray; kill -9 it while benchmarking."""
    port = free_port()
    path = experiment(str(tmp_path), name="own", port=port, n_trials=3, bench=LONG_BENCH)
    needles = (str(tmp_path / "own"), f"--port {port} ")
    driver = Driver([path, "cluster.num_cpus=2"])
    try:
        line = driver.wait_for(r"\[trial 0\] benchmarking", timeout_s=180)
        assert line is not None, driver.output()
        assert processes_with(*needles)
        driver.signal(signal.SIGKILL)
        assert driver.wait(timeout_s=10) == -signal.SIGKILL
        assert wait_no_processes(*needles, timeout_s=GONE_WITHIN_S) == {}
    finally:
        driver.kill_session()
        kill_leftovers(*needles)


@pytest.fixture(scope="module")
def killed_mid_trial(ray_cluster, tmp_path_factory):
    """An outside ``ray.kill`` of trial 0's ServerActor (as Ray's OOM killer or an operator
    would) while it benchmarks; the study then runs trial 1."""
    import threading

    import ray

    from rayspec._config import load_config
    from rayspec.store import ParquetTrialStore
    from rayspec.tune import run_study
    from rayspec.tune._trial import run_trial

    port = free_port()
    bench = {"max_tokens": 100, "repeats": 1, "read_timeout_s": 10}
    folder = str(tmp_path_factory.mktemp("killed"))
    cfg = load_config(experiment(folder, name="killed", port=port, n_trials=2, bench=bench), [])
    needles = (cfg.out_dir, f"--port {port} ")
    killed: list[list[int]] = []

    def kill_server_of(number: int) -> None:
        actor = ray.get_actor(f"rayspec-server-trial-{number}")
        killed.append(ray.get(actor.pids.remote(), timeout=30))
        ray.kill(actor)

    def trial(cfg_, number, candidate, *, on_phase=None, **kwargs):
        def phase(n: int, name: str) -> None:
            if on_phase is not None:
                on_phase(n, name)
            if n == 0 and name == "benchmarking":
                threading.Timer(0.5, kill_server_of, args=(n,)).start()

        return run_trial(cfg_, number, candidate, on_phase=phase, **kwargs)

    try:
        run_study(cfg, printer=lambda _s: None, trial_fn=trial)
        left = wait_no_processes(*needles, timeout_s=GONE_WITHIN_S)
    finally:
        kill_leftovers(*needles)
    rows = {r["trial"]: r for r in ParquetTrialStore(cfg.out_dir).load_trials().to_pylist()}
    return killed, left, rows


def test_server_actor_killed_mid_trial_is_a_recorded_fail(killed_mid_trial) -> None:
    killed, left, rows = killed_mid_trial
    assert killed and len(killed[0]) >= 2  # the reaper and the server were up
    assert left == {}
    assert rows[0]["state"] == "FAIL", rows[0]
    # Killed from outside (its node alive): not the configuration's failure, tried again once.
    assert rows[0]["failure"] == "actor_lost", rows[0]["failure_detail"]
    assert rows[0]["restart"] is not None and rows[1]["candidate"] == rows[0]["candidate"]
    assert rows[1]["state"] == "COMPLETE", rows[1]["failure_detail"]


def test_server_actor_killed_mid_trial_keeps_the_log_tail(killed_mid_trial) -> None:
    _, _, rows = killed_mid_trial
    assert "stopping the server tree" in (rows[0]["log_tail"] or ""), rows[0]
