"""Chaos with real processes: ``python -m rayspec.tune`` on the twin (servers started by Ray
actors), hit at seeded random moments by SIGKILL, SIGINT, SIGTERM or SIGSTOP of the driver, the
kill of its twin server or of the Ray worker that holds the server's actor; then the same command
again until the study ends. After each hit: no server, reaper or driver left; a stopped driver
still holds its study (a second driver is refused with one line naming it, exit 2). At the end,
the in-process suite's invariants (``_chaos.Invariants``) on the study folder.

``RAYSPEC_CHAOS_SEED`` picks the hits (printed on failure); ``RAYSPEC_CHAOS_HITS`` their number
(default 3, about 40 s on two cores).
"""

from __future__ import annotations

import os
import random
import signal
import time

from rayspec._config import load_config
from tests.chaos_tests._chaos import SEED_ENV
from tests.chaos_tests._chaos import Invariants
from tests.chaos_tests._chaos import base_seed
from tests.helpers import free_port
from tests.reliability_tests._support import Driver
from tests.reliability_tests._support import descendants
from tests.reliability_tests._support import experiment
from tests.reliability_tests._support import kill_leftovers
from tests.reliability_tests._support import processes_with
from tests.reliability_tests._support import wait_no_processes

HITS = ("SIGKILL", "SIGINT", "SIGTERM", "SIGSTOP", "kill-server", "kill-actor")
N_HITS = int(os.environ.get("RAYSPEC_CHAOS_HITS", "3"))
LL128 = {"spec.mode": "EAGLE3", "spec.num_steps": 2, "spec.eagle_topk": 1,
         "nccl.NCCL_PROTO": "LL128", "nccl.NCCL_P2P_LEVEL": "SYS"}  # fmt: skip


def _kill_matching(needle: str) -> bool:
    """SIGKILL this session's own processes matching ``needle`` (never another test's)."""
    found = set(processes_with(needle)) & descendants()
    for pid in found:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return bool(found)


def test_hits_at_random_moments_then_resume(ray_cluster, tmp_path) -> None:
    import ray

    seed = base_seed()
    rng = random.Random(seed)
    # Distinct kinds, a stopped driver always among them (the study lock's case).
    hits = ["SIGSTOP", *rng.sample([h for h in HITS if h != "SIGSTOP"], max(0, N_HITS - 1))]
    rng.shuffle(hits)
    landed: list[str] = []
    where = f"{SEED_ENV}={seed}: hits {hits}"
    port = free_port()
    path = experiment(
        str(tmp_path), name="chaos", port=port, n_trials=5, enqueue=[LL128],
        nccl={"NCCL_PROTO": ["unset", "LL", "LL128"], "NCCL_P2P_LEVEL": ["unset", "SYS"]},
        cluster={"address": ray.get_runtime_context().gcs_address},
    )  # fmt: skip
    out = str(tmp_path / "chaos")
    needles = (out, f"--port {port} ")
    lines: list[str] = []
    try:
        for hit in hits:
            driver = Driver([path])
            try:
                started = driver.wait_for(
                    r"\] (placing|starting server|benchmarking)|resuming", 120
                )
                if started is None:  # the study already ended: nothing left to hit
                    assert driver.wait_progressing() == 0, f"{where}\n{driver.output()}"
                    break
                time.sleep(rng.uniform(0.0, 2.0))
                if hit == "kill-server":
                    landed += [hit] if _kill_matching(f"--port {port} ") else []
                elif hit == "kill-actor":
                    landed += [hit] if _kill_matching("ray::ServerActor") else []
                elif hit == "SIGSTOP":
                    driver.signal(signal.SIGSTOP)
                    second = Driver([path])
                    code = second.wait(60)
                    driver.wait_for(r"^$", 0.5)  # what the stopped driver had printed
                    ended = any("nothing left to run" in line for line in driver.lines)
                    if not (ended and code == 0):  # else it stopped after its lock was let go
                        assert code == 2, f"{where}: second driver exit {code}\n{second.output()}"
                        said = [line for line in second.lines if "in use by another" in line]
                        assert len(said) == 1 and f"pid {driver.proc.pid} " in said[0], (
                            second.output()
                        )
                    driver.signal(signal.SIGKILL)
                else:
                    driver.signal(getattr(signal, hit))
                code = driver.wait_progressing()
                assert code is not None, (
                    f"{where}: the driver printed nothing for 120 s after {hit}\n{driver.output()}"
                )
            finally:
                driver.kill_session()
                lines += driver.lines
            left = wait_no_processes(*needles, timeout_s=20)
            assert left == {}, f"{where}: alive after {hit}: {left}"
        final = Driver([path])
        try:
            code = final.wait_progressing()
            lines += final.lines
            assert code == 0, f"{where}\n{final.output()}"
        finally:
            final.kill_session()
        assert wait_no_processes(*needles, timeout_s=20) == {}, where
    finally:
        kill_leftovers(*needles)
    cfg = load_config(path, [])
    inv = Invariants()
    try:
        inv.after_run(cfg, lines, final=True)
        best = [line for line in lines if line.startswith("best: ")]
        inv.ok(bool(best) and "PROTO=LL128" not in best[-1], f"picked: {best}")
    except AssertionError as exc:
        raise AssertionError(f"{where}: {exc}") from exc
    print(
        f"\nchaos (processes): hits {hits} from seed {seed} (process kills that found their "
        f"process: {landed}), {inv.checked} invariant checks"
    )
