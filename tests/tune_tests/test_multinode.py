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
    "bench.repeats=2",
    "bench.max_repeats=2",
    "bench.max_tokens=60",
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
    cfg = _cfg(tmp_path, "server.tp_size=4", "study.max_restarts=4")
    outcome = run_study(cfg, printer=lambda _l: None, slots=functools.partial(room, 4, KIND))
    rows = _rows(cfg)
    assert outcome.restarts == 4 and len(rows) == outcome.ran
    assert {_node_of(r) for r in rows if r["command"]} == {a.node_id[:12]}
    assert all(r["state"] == "COMPLETE" for r in rows), [r["failure_detail"] for r in rows]
    pairs = _overlapping(rows)
    assert pairs, "no two TP4 trials ran at once on the 8-GPU node"
    assert all(_port(x) != _port(y) for x, y in pairs)  # one node, distinct ports


def test_a_node_that_joins_mid_study_is_used(nodes: _Nodes, tmp_path) -> None:
    if not nodes.alive(KIND):
        nodes.add(KIND)
    cfg = _cfg(tmp_path, "server.tp_size=8", "study.max_restarts=4")
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
    assert not study.is_alive() and out["o"].restarts == 4
    rows = _rows(cfg)
    assert late.node_id[:12] in {_node_of(r) for r in rows}, "the late node ran no trial"
    assert _overlapping(rows), "the late node never ran a trial beside the first node's"


def test_a_node_lost_mid_trial_is_retried_elsewhere(nodes: _Nodes, tmp_path) -> None:
    while len(nodes.alive(KIND)) < 2:
        nodes.add(KIND)
    # Long enough trials (a slow start) that the node can be removed while one runs.
    cfg = _cfg(tmp_path, "server.tp_size=8", "study.max_restarts=4", "server.twin.startup_s=2")
    assert room(8, KIND) >= 2
    lines: list[str] = []
    out: dict[str, Any] = {}
    study = threading.Thread(
        target=lambda: out.update(o=run_study(
            cfg, printer=lines.append, slots=functools.partial(room, 8, KIND)))
    )  # fmt: skip
    study.start()
    logs = os.path.join(cfg.out_dir, "logs")
    _wait_for(lambda: len(glob.glob(os.path.join(logs, "trial-*.log"))) >= 2, 60, "two trials")
    time.sleep(1.0)  # both servers starting
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
    assert retry["state"] == "COMPLETE" and retry["candidate"] == lost[0]["candidate"]
    assert _node_of(retry) != victim.node_id[:12]
    # Nothing lost, nothing twice: one row per Optuna trial, none left running.
    numbers = [r["trial"] for r in rows]
    assert sorted(numbers) == sorted({t.number for t in handle.trials()})
    assert len(set(numbers)) == len(numbers) and not handle.running()
    assert out["o"].restarts == 4
