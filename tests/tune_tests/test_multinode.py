"""One study over several Ray nodes, on one machine: ``ray.cluster_utils.Cluster`` nodes that
declare 8 fake GPUs each (and a custom resource naming their kind) run twin trials.

Placement and packing (two TP4 trials share a node; a node without ``cluster.node_resource``
is never used), a node that joins mid-study, and a node removed mid-trial (``node_lost``,
retried once on another node, nothing lost or duplicated).
"""

from __future__ import annotations

import functools
import glob
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pyarrow.parquet as pq
import pytest

from rayspec._config import ExperimentConfig
from rayspec._config import load_config
from rayspec.search import SearchSpace
from rayspec.search import open_study
from rayspec.tune import run_study
from rayspec.tune._cluster import room
from tests.conftest import start_local_ray
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import free_port_block

KIND = "h200"  # the node kind the studies ask for; the "l40s" node must never be used
FAST = [
    "bench.warmup=0",
    "bench.repeats=1",
    "bench.max_repeats=1",
    "bench.max_tokens=40",
    "server.twin.startup_s=0.2",
    "study.pruning=false",
    "cluster.max_concurrent_trials=0",
    f"cluster.node_resource={KIND}",
]
# Ray marks a node dead after health checks it misses: fast ones, so a lost node is seen in
# about a second rather than fifteen.
_HEALTH = {
    "health_check_period_ms": 500,
    "health_check_failure_threshold": 3,
    "health_check_timeout_ms": 500,
    "health_check_initial_delay_ms": 0,
}


class _Nodes:
    """The test cluster: a head without GPUs, and 8-GPU worker nodes added by the tests."""

    def __init__(self) -> None:
        from ray.cluster_utils import Cluster

        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": 1,
                "num_gpus": 0,
                "include_dashboard": False,
                "_system_config": _HEALTH,
            },
        )
        self.kinds: dict[str, str] = {}  # node id -> kind

    def add(self, kind: str) -> Any:
        # Two CPUs: each trial's bench actor takes one, two TP4 trials share a node.
        node = self.cluster.add_node(num_cpus=2, num_gpus=8, resources={kind: 1})
        self.kinds[node.node_id] = kind
        return node

    def alive(self, kind: str) -> list[Any]:
        """Worker nodes of ``kind`` not removed."""
        return [n for n in self.cluster.worker_nodes if self.kinds.get(n.node_id) == kind]


@pytest.fixture(scope="module")
def nodes() -> Iterator[_Nodes]:
    import ray

    had_local = ray.is_initialized()  # the session's one-node cluster: back after this module
    if had_local:
        ray.shutdown()
    cluster = _Nodes()
    ray.init(address=cluster.cluster.address, log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.cluster.shutdown()
        if had_local:
            start_local_ray()


def _cfg(tmp_path: Any, *extra: str) -> ExperimentConfig:
    port = f"server.port={free_port_block(8)}"
    return load_config(TWIN_EXPERIMENT, [f"output.dir={tmp_path}", port, *FAST, *extra])


def _rows(cfg: ExperimentConfig) -> list[dict[str, Any]]:
    """The stored trial rows, read file by file."""
    files = sorted(glob.glob(os.path.join(cfg.out_dir, "trials", "*.parquet")))
    return [pq.read_table(f).to_pylist()[0] for f in files]


def _node_of(row: dict[str, Any]) -> str:
    """The node id prefix a row records (``"<ip> <node id>"``)."""
    return str(row["node"]).split()[-1]


def _overlapping(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    launched = [r for r in rows if r["command"]]
    return [
        (a, b)
        for i, a in enumerate(launched)
        for b in launched[i + 1 :]
        if a["start_unix_s"] < b["end_unix_s"] and b["start_unix_s"] < a["end_unix_s"]
    ]


def _port(row: dict[str, Any]) -> str:
    import json

    argv = json.loads(row["command"])
    return str(argv[argv.index("--port") + 1])


def _free_gpus_of(nodes: _Nodes, kind: str) -> float:
    """GPUs free now on the alive nodes of ``kind`` (the other nodes' GPUs are never used)."""
    import ray

    others = sum(8 for n in nodes.cluster.worker_nodes if nodes.kinds.get(n.node_id) != kind)
    return float(ray.available_resources().get("GPU", 0.0)) - others


def _wait_for(check: Any, timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_tp4_trials_pack_onto_the_nodes_of_the_asked_kind(nodes: _Nodes, tmp_path) -> None:
    a = nodes.add(KIND)
    nodes.add("l40s")  # 8 GPUs too, but not the study's kind
    # Room is counted per node (8 // 4 on the one h200 node), never on the l40s node.
    assert room(4, KIND) == 2 and room(4) == 4 and room(8, KIND) == 1 and room(3, KIND) == 2
    cfg = _cfg(tmp_path, "server.tp_size=4", "study.max_restarts=3")
    outcome = run_study(cfg, printer=lambda _l: None, slots=functools.partial(room, 4, KIND))
    rows = _rows(cfg)
    assert outcome.restarts == 3 and len(rows) == outcome.ran
    assert {_node_of(r) for r in rows if r["command"]} == {a.node_id[:12]}
    assert all(r["state"] == "COMPLETE" for r in rows), [r["failure_detail"] for r in rows]
    pairs = _overlapping(rows)
    assert pairs, "no two TP4 trials ran at once on the 8-GPU node"
    assert all(_port(x) != _port(y) for x, y in pairs)  # one node, distinct ports


def test_a_node_that_joins_mid_study_is_used(nodes: _Nodes, tmp_path) -> None:
    if not nodes.alive(KIND):
        nodes.add(KIND)
    cfg = _cfg(tmp_path, "server.tp_size=8", "study.max_restarts=3")
    assert room(8, KIND) == 1
    out: dict[str, Any] = {}
    study = threading.Thread(
        target=lambda: out.update(o=run_study(
            cfg, printer=lambda _l: None, slots=functools.partial(room, 8, KIND)))
    )  # fmt: skip
    study.start()
    _wait_for(lambda: os.path.exists(os.path.join(cfg.out_dir, "logs", "trial-000000.log")),
              60, "the first trial")  # fmt: skip
    late = nodes.add(KIND)
    study.join(timeout=120)
    assert not study.is_alive() and out["o"].restarts == 3
    rows = _rows(cfg)
    assert late.node_id[:12] in {_node_of(r) for r in rows}, "the late node ran no trial"
    assert _overlapping(rows), "the late node never ran a trial beside the first node's"


def test_a_node_lost_mid_trial_is_retried_elsewhere(nodes: _Nodes, tmp_path) -> None:
    while len(nodes.alive(KIND)) < 2:
        nodes.add(KIND)
    # Long enough trials (a slow start) that the node can be removed while one runs.
    cfg = _cfg(tmp_path, "server.tp_size=8", "study.max_restarts=4", "server.twin.startup_s=1.5")
    assert room(8, KIND) >= 2
    lines: list[str] = []
    out: dict[str, Any] = {}
    study = threading.Thread(
        target=lambda: out.update(o=run_study(
            cfg, printer=lines.append, slots=functools.partial(room, 8, KIND)))
    )  # fmt: skip
    study.start()
    # Every h200 node busy (one TP8 trial each), then a moment into the trials.
    _wait_for(lambda: _free_gpus_of(nodes, KIND) == 0, 60, "a trial on each node")
    time.sleep(1.0)
    victim = nodes.alive(KIND)[-1]
    nodes.cluster.remove_node(victim, allow_graceful=False)
    study.join(timeout=150)
    assert not study.is_alive()
    rows = _rows(cfg)
    lost = [r for r in rows if r["failure"] == "node_lost"]
    assert len(lost) == 1 and _node_of(lost[0]) == victim.node_id[:12], [
        (r["trial"], r["failure"], r["node"]) for r in rows
    ]
    assert any(f"trial {lost[0]['trial']}: its node died" in line for line in lines)
    # Retried once, on the node left; the study went on to its budget.
    handle = open_study(cfg, SearchSpace.from_config(cfg.search))
    retries = [t for t in handle.trials() if t.attrs.get("retry_of") == lost[0]["trial"]]
    assert len(retries) == 1
    retry = next(r for r in rows if r["trial"] == retries[0].number)
    assert retry["state"] == "COMPLETE" and retry["candidate"] == lost[0]["candidate"], (
        retry["state"],
        retry["failure"],
        retry["failure_detail"],
        retry["node"],
        lines[-12:],
    )
    assert _node_of(retry) != victim.node_id[:12]
    # Nothing lost, nothing twice: one row per Optuna trial, none left running.
    numbers = [r["trial"] for r in rows]
    assert sorted(numbers) == sorted({t.number for t in handle.trials()})
    assert len(set(numbers)) == len(numbers) and not handle.running()
    assert out["o"].restarts == 4


def test_a_killed_cli_driver_resumes_with_trials_on_two_nodes(nodes: _Nodes, tmp_path) -> None:
    """``python -m rayspec.tune`` joins the cluster (``cluster.address``), runs one trial per
    node; SIGKILL it mid-trial, run it again: the trials that ran are interrupted and tried
    again, no server outlives its driver, one row per Optuna trial."""
    import signal
    import subprocess
    import sys

    from tests.helpers import REPO
    from tests.reliability_tests._support import SUBPROCESS_ENV
    from tests.reliability_tests._support import kill_leftovers
    from tests.reliability_tests._support import wait_no_processes

    while len(nodes.alive(KIND)) < 2:
        nodes.add(KIND)
    port = free_port_block(8)
    argv = [
        sys.executable, "-m", "rayspec.tune", TWIN_EXPERIMENT, f"output.dir={tmp_path}",
        f"cluster.address={nodes.cluster.address}", f"server.port={port}", *FAST,
        "server.tp_size=8", "study.max_restarts=3", "server.twin.startup_s=1.5",
    ]  # fmt: skip
    logs = os.path.join(str(tmp_path), "eagle3-twin", "logs")
    ours = [f"--port {p} " for p in range(port, port + 8)]  # this study's twin servers
    first = subprocess.Popen(argv, cwd=REPO, env=SUBPROCESS_ENV, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        # Both h200 nodes busy at once: one TP8 trial on each.
        _wait_for(lambda: _free_gpus_of(nodes, KIND) == 0, 90, "a trial on each node")
        _wait_for(lambda: len(glob.glob(os.path.join(logs, "trial-*.log"))) >= 2, 30,
                  "two trials")  # fmt: skip
        time.sleep(1.0)
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        left = wait_no_processes(*ours, timeout_s=20)
        assert not left, f"servers outlived the killed driver: {left}"
        again = subprocess.run(argv, cwd=REPO, env=SUBPROCESS_ENV, capture_output=True,
                               text=True, timeout=180)  # fmt: skip
        assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
        # The cluster as the driver counts it: the l40s node's GPUs are not the study's.
        assert f"2 nodes with {KIND}, 16 GPUs, 2 trials at once" in again.stdout
    finally:
        if first.poll() is None:
            first.kill()
        kill_leftovers(*ours)
    cfg = load_config(TWIN_EXPERIMENT, [f"output.dir={tmp_path}", *FAST])  # as measured
    rows = _rows(cfg)
    handle = open_study(cfg, SearchSpace.from_config(cfg.search))
    interrupted = [r for r in rows if r["failure"] == "interrupted"]
    assert len(interrupted) == 2, [(r["trial"], r["failure"], r["node"]) for r in rows]
    retried = {t.attrs.get("retry_of") for t in handle.trials()}
    assert all(r["trial"] in retried for r in interrupted)
    numbers = [r["trial"] for r in rows]
    assert sorted(numbers) == sorted(t.number for t in handle.trials())
    assert not handle.running()
    assert sum(1 for r in rows if r["command"] and r["failure"] != "interrupted") == 3


class _Holder:
    """A job outside the study holding a node's GPUs."""

    def ready(self) -> bool:
        return True


def test_a_trial_with_no_room_fails_after_the_placement_timeout(nodes: _Nodes, tmp_path) -> None:
    """Every h200 GPU held outside the study: each trial says what it waits for, is recorded
    ``no_placement`` after ``cluster.placement_timeout_s`` (no server, no restart), is queued
    again for a resume, and the study stops with one line."""
    import ray

    if not nodes.alive(KIND):
        nodes.add(KIND)
    hold = ray.remote(num_cpus=0, num_gpus=8, resources={KIND: 0.001})(_Holder)
    holders = [hold.remote() for _ in nodes.alive(KIND)]
    cfg = _cfg(tmp_path, "server.tp_size=8", "study.max_restarts=3",
               "cluster.placement_timeout_s=2")  # fmt: skip
    lines: list[str] = []
    try:
        ray.get([h.ready.remote() for h in holders], timeout=60)
        outcome = run_study(cfg, printer=lines.append, slots=functools.partial(room, 8, KIND))
    finally:
        for h in holders:
            ray.kill(h)
    rows = _rows(cfg)
    assert rows and all(r["failure"] == "no_placement" and not r["command"] for r in rows), [
        (r["trial"], r["failure"], r["failure_detail"]) for r in rows
    ]
    assert outcome.restarts == 0 and outcome.stopped.startswith("no room on the cluster")
    assert any(f"waiting for 8 GPUs on one node with {KIND}" in line for line in lines), lines
    handle = open_study(cfg, SearchSpace.from_config(cfg.search))
    retried = {t.attrs.get("retry_of") for t in handle.trials() if t.optuna_state == "WAITING"}
    assert {r["trial"] for r in rows} <= retried and not handle.running()
