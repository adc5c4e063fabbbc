"""Signals to the driver's whole process group, as ``timeout``, Slurm's ``scancel``, systemd and
a closed terminal send them (issue 33, item 9): ``python -m rayspec.tune`` on the twin with its
own private Ray cluster (the default set-up, whose Ray processes the driver starts), hit by
SIGTERM, SIGINT or SIGHUP to its process group.

Before each hit the driver must be alone in its process group (the private cluster's GCS, raylet
and agents lead groups of their own): in the driver's group they took the signal with it and
shut down half-way, so the driver could not stop its actors and hung until Ray aborted it (exit
1). After each hit: exit 130 with the one "interrupted" line, nothing of the driver's session
left (servers, reapers, Ray), and the study resumes to its end with the chaos suite's invariants.

Every wait is on the driver's progress (``Driver.wait_progressing``), not on a clock.
``RAYSPEC_CHAOS_SEED`` picks the order and moments of the hits (printed on failure).
"""

from __future__ import annotations

import os
import random
import signal
import time

import pytest

from rayspec._config import load_config
from rayspec.search._stored import stored_trials
from tests.chaos_tests._chaos import SEED_ENV
from tests.chaos_tests._chaos import Invariants
from tests.chaos_tests._chaos import base_seed
from tests.helpers import free_port
from tests.reliability_tests._support import Driver
from tests.reliability_tests._support import experiment
from tests.reliability_tests._support import kill_leftovers
from tests.reliability_tests._support import processes_with

GROUP_HITS = ("SIGTERM", "SIGINT", "SIGHUP")
# Where in a driver's life a hit lands: the phase line it waits for.
MOMENTS = (
    r"\] (placing|starting server)",
    r"\] waiting for ready",
    r"\] benchmarking",
    r"local Ray cluster",
)
# About a minute of one request at the twin's rate: a driver that waits for the trial (or for
# Ray to give up on its GCS) instead of stopping it is still benchmarking when it is asked.
LONG_BENCH = {"max_tokens": 3000, "repeats": 1, "read_timeout_s": 30}


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()


def _with(field: int, value: int) -> dict[int, str]:
    """Live processes whose stat ``field`` (2: process group, 3: session) is ``value``."""
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat(int(entry))
        if fields is None or fields[0] in ("Z", "X") or int(fields[field]) != value:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                found[int(entry)] = fh.read().replace(b"\0", b" ").decode(errors="replace")[:100]
        except OSError:
            continue
    return found


def group_beside(driver: Driver) -> dict[int, str]:
    """The processes in the driver's process group other than the driver."""
    return {p: c for p, c in _with(2, driver.proc.pid).items() if p != driver.proc.pid}


def session_left(driver: Driver, needles: tuple[str, ...]) -> dict[int, str]:
    """What is still alive of the driver's session (its Ray cluster, the trial's actors) and of
    its study (servers and reapers run in sessions of their own) once the driver has ended,
    polled for a bounded while (the driver stops its cluster before it exits)."""
    end = time.monotonic() + 20
    while True:
        left = {**processes_with(*needles), **_with(3, driver.proc.pid)}
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.1)


def _hit(driver: Driver, name: str, where: str) -> int | None:
    beside = group_beside(driver)
    assert beside == {}, f"{where}: in the driver's process group beside it: {beside}"
    os.killpg(driver.proc.pid, getattr(signal, name))
    return driver.wait_progressing()


def test_a_sigterm_to_the_group_mid_benchmark_ends_like_ctrl_c(tmp_path) -> None:
    """The issue's case: ``timeout`` (SIGTERM to the group) while a long benchmark runs."""
    port = free_port()
    path = experiment(str(tmp_path), name="grp", port=port, n_trials=3, bench=LONG_BENCH)
    needles = (str(tmp_path / "grp"), f"--port {port} ")
    driver = Driver([path])
    try:
        assert driver.wait_for(r"\[trial 0\] benchmarking", 300) is not None, driver.output()
        code = _hit(driver, "SIGTERM", "SIGTERM mid-benchmark")
        out = driver.output()
        assert code == 130, f"exit {code}:\n{out}"
        said = [line for line in driver.lines if "interrupted: servers stopped" in line]
        assert len(said) == 1, out
        assert not any("[restart 1/" in line for line in driver.lines), out  # nothing recorded
        assert session_left(driver, needles) == {}
    finally:
        driver.kill_session()
        kill_leftovers(*needles)
    # Resumable: the trial is left running in the study, for the next driver to record as
    # interrupted and try again.
    cfg = load_config(path, [])
    states = [t.optuna_state for t in stored_trials(cfg) or []]
    assert states == ["RUNNING"], states


@pytest.mark.timeout(600)  # four drivers, each starting its own Ray: minutes on a busy machine
def test_group_signals_at_random_moments_then_resume(tmp_path) -> None:
    seed = base_seed()
    rng = random.Random(seed)
    hits = list(GROUP_HITS)
    rng.shuffle(hits)
    moments = [rng.choice(MOMENTS) for _ in hits]
    where = f"{SEED_ENV}={seed}: group hits {list(zip(hits, moments, strict=True))}"
    port = free_port()
    path = experiment(str(tmp_path), name="grp", port=port, n_trials=3)
    needles = (str(tmp_path / "grp"), f"--port {port} ")
    lines: list[str] = []
    landed: list[str] = []
    try:
        for hit, moment in zip(hits, moments, strict=True):
            driver = Driver([path])
            try:
                if driver.wait_for(f"{moment}|resuming", 300) is None:  # the study ended
                    assert driver.wait_progressing() == 0, f"{where}\n{driver.output()}"
                    break
                driver.wait_for(r"^$", rng.uniform(0.0, 2.0))  # a random moment after it
                code = _hit(driver, hit, f"{where}: before {hit}")
                landed.append(hit)
                out = driver.output()
                if code == 0 and any("nothing left to run" in line for line in driver.lines):
                    break  # it had ended before the hit
                assert code == 130, f"{where}: exit {code} after {hit}\n{out}"
                said = [line for line in driver.lines if "interrupted: servers stopped" in line]
                assert len(said) == 1, f"{where}\n{out}"
                assert not any("Traceback" in line for line in driver.lines), f"{where}\n{out}"
                left = session_left(driver, needles)
                assert left == {}, f"{where}: alive after {hit}: {left}"
            finally:
                driver.kill_session()
                lines += driver.lines
        final = Driver([path])
        try:
            code = final.wait_progressing()
            lines += final.lines
            assert code == 0, f"{where}\n{final.output()}"
            assert session_left(final, needles) == {}, where
        finally:
            final.kill_session()
    finally:
        kill_leftovers(*needles)
    cfg = load_config(path, [])
    inv = Invariants()
    try:
        inv.after_run(cfg, lines, final=True)
    except AssertionError as exc:
        raise AssertionError(f"{where}: {exc}") from exc
    print(f"\nchaos (group signals): {where}, landed {landed}, {inv.checked} invariant checks")
