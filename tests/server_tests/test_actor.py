"""ServerActor on the shared local Ray cluster: typed errors and no orphan in any ending."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from conftest import fake_pids
from conftest import wait_gone

from rayspec._exceptions import FailureReason
from rayspec._exceptions import LaunchError
from rayspec._exceptions import ServerExited

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.usefixtures("ray_cluster")


def _actor(num_gpus: int = 1):
    from rayspec.server import ServerActor

    return ServerActor.options(num_gpus=num_gpus).remote(grace_s=2.0)


def test_lifecycle_environment_and_teardown(make_launch) -> None:
    launch = make_launch(
        "--spawn-tree",
        "--ready-after-s",
        "0.3",
        "--print-env",
        "CUDA_VISIBLE_DEVICES,NCCL_PROTO,OMP_NUM_THREADS,PYTHONBREAKPOINT,RAY_JOB_ID",
        env={"NCCL_PROTO": "LL"},
    )
    actor = _actor(num_gpus=2)
    try:
        ray.get(actor.start.remote(launch))
        info = ray.get(actor.wait_ready.remote(), timeout=60)
        assert info["fake"] is True
        assert ray.get(actor.alive.remote())
        ray.get(actor.flush_cache.remote())
        assert isinstance(ray.get(actor.node_ip.remote()), str)
        tree = ray.get(actor.pids.remote())
        pids = fake_pids(launch.log_path)
        assert set(pids.values()) <= set(tree)
        env = json.loads(re.search(r"FAKE_ENV (.*)", Path(launch.log_path).read_text()).group(1))
        assert env["NCCL_PROTO"] == "LL"
        assert len(env["CUDA_VISIBLE_DEVICES"].split(",")) == 2  # Ray's assignment reached it
        # Ray's worker-only additions did not (the node's own value, if any, did).
        assert env["OMP_NUM_THREADS"] == os.environ.get("OMP_NUM_THREADS")
        assert not (env["PYTHONBREAKPOINT"] or "").startswith("ray.")
        assert env["RAY_JOB_ID"] is None
        assert ray.get(actor.stop.remote()) == -15
        assert not ray.get(actor.alive.remote())
        assert wait_gone(tree) == []
        with pytest.raises(LaunchError, match="already started"):
            ray.get(actor.start.remote(launch))
    finally:
        ray.kill(actor)


def test_the_server_runs_at_the_nodes_niceness_not_the_workers(make_launch) -> None:
    """Ray starts its workers at niceness 15 (``RAY_worker_niceness``; this session's cluster
    sets 0, so the test sets the worker to 15 itself); a server started from one runs at the
    node's (the raylet's), as best.sh would run it, and so does the reaper that tears it down."""
    launch = make_launch("--ready-after-s", "0")
    actor = _actor()
    try:
        worker = ray.get(actor.__ray_call__.remote(lambda _self: os.getpid()))
        for tid in os.listdir(f"/proc/{worker}/task"):  # niceness is per thread on Linux
            os.setpriority(os.PRIO_PROCESS, int(tid), 15)  # raising it needs no privilege
        ray.get(actor.start.remote(launch))
        ray.get(actor.wait_ready.remote(), timeout=60)
        reaper, server, *_ = ray.get(actor.pids.remote())
        node = os.getpriority(os.PRIO_PROCESS, 0)  # this process started the raylet
        assert os.getpriority(os.PRIO_PROCESS, worker) == 15 != node
        assert os.getpriority(os.PRIO_PROCESS, server) == node
        assert os.getpriority(os.PRIO_PROCESS, reaper) == node
    finally:
        ray.kill(actor)


def test_ray_kill_leaves_no_process(make_launch) -> None:
    launch = make_launch("--spawn-tree", "--ready-after-s", "0")
    actor = _actor()
    ray.get(actor.start.remote(launch))
    ray.get(actor.wait_ready.remote(), timeout=60)
    tree = ray.get(actor.pids.remote())
    assert len(tree) >= 7  # reaper, server, child, sh, grandchild, setsid'd grandchild, orphan
    ray.kill(actor)
    assert wait_gone(tree, timeout_s=20.0) == []
    assert "owner process" in Path(launch.log_path).read_text()


def test_typed_failure_crosses_ray(make_launch) -> None:
    launch = make_launch("--fail", "nccl_init", "--spawn-tree")
    actor = _actor()
    try:
        ray.get(actor.start.remote(launch))
        with pytest.raises(ServerExited) as err:
            ray.get(actor.wait_ready.remote(), timeout=60)
        exc = err.value
        assert exc.reason is FailureReason.NCCL_INIT
        assert exc.returncode == 1
        assert "ncclInvalidUsage" in exc.log_tail
        ray.get(actor.stop.remote())
        assert wait_gone(list(fake_pids(launch.log_path).values())) == []
    finally:
        ray.kill(actor)


def test_gpu_variable_is_rays(make_launch) -> None:
    actor = _actor()
    try:
        with pytest.raises(LaunchError, match="CUDA_VISIBLE_DEVICES") as err:
            ray.get(actor.start.remote(make_launch(env={"CUDA_VISIBLE_DEVICES": "7"})))
        assert err.value.reason is FailureReason.INFEASIBLE
    finally:
        ray.kill(actor)


def test_node_environment_without_a_readable_raylet() -> None:
    from rayspec.server._actor import node_environment

    worker = {
        "PATH": "/bin",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "OMP_NUM_THREADS": "1",
        "PYTHONBREAKPOINT": "ray.util.rpdb.set_trace",
        "RAY_JOB_ID": "ffffffff",
        "RAY_RAYLET_PID": "not-a-pid",
        "SPT_NOENV": "1",
    }
    assert node_environment(worker) == {
        "PATH": "/bin",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "OMP_NUM_THREADS": "1",  # origin unknown without the raylet: kept
    }
