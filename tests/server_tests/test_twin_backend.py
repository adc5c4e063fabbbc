"""The digital twin driven through the server layer: readiness, and its failures classified."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from conftest import wait_gone

from rayspec._exceptions import FailureReason
from rayspec._exceptions import ServerExited
from rayspec._types import LaunchSpec
from rayspec.server import TwinBackend
from rayspec.server import parse_startup_summary
from tests.helpers import free_port

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("rayspec.twin.server") is None
    or importlib.util.find_spec("aiohttp") is None,
    reason="the twin server (rayspec.twin.server) is not importable",
)


def twin_launch(tmp_path: Path, *, steps: int, topk: int, ndt: int, env=()) -> LaunchSpec:
    port = free_port()
    argv = (
        sys.executable, "-m", "rayspec.twin.server",
        "--model-path", "moonshotai/Kimi-K2.5", "--tp-size", "8",
        "--host", "127.0.0.1", "--port", str(port),
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "drafter",
        "--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk),
        "--speculative-num-draft-tokens", str(ndt),
        "--max-running-requests", "8", "--twin-startup-s", "0.2", "--twin-seed", "1",
    )  # fmt: skip
    return LaunchSpec(
        argv=argv,
        env=tuple(env),
        host="127.0.0.1",
        port=port,
        log_path=str(tmp_path / f"twin-{port}.log"),
        startup_timeout_s=60.0,
        engine="twin",
    )


@pytest.mark.usefixtures("ray_cluster")
def test_twin_through_server_actor(tmp_path: Path) -> None:
    import ray

    from rayspec.server import ServerActor

    launch = twin_launch(tmp_path, steps=2, topk=1, ndt=3, env=(("NCCL_PROTO", "LL"),))
    actor = ServerActor.options(num_gpus=8).remote(grace_s=3.0)
    try:
        ray.get(actor.start.remote(launch))
        info = ray.get(actor.wait_ready.remote(), timeout=90)
        assert info["speculative_num_steps"] == 2
        assert info["speculative_num_draft_tokens"] == 3
        ray.get(actor.flush_cache.remote())
        summary = parse_startup_summary(ray.get(actor.log_tail.remote(200)))
        assert summary is not None and summary.max_running_requests == 8
        tree = ray.get(actor.pids.remote())
        ray.get(actor.stop.remote())
        assert wait_gone(tree) == []
    finally:
        ray.kill(actor)


@pytest.mark.parametrize(
    ("spec", "env", "expected"),
    [
        ((2, 2, 16), (), FailureReason.INVALID_DRAFT_TREE),  # ndt - 1 > 2 + 1 * 4
        ((2, 1, 3), (("NCCL_PROTO", "LL256"),), FailureReason.NCCL_INIT),
        ((2, 1, 3), (("NCCL_ALGO", "NVLS"),), FailureReason.NCCL_FIRST_COLLECTIVE),
    ],
)
def test_twin_failures_are_classified(tmp_path: Path, spec, env, expected) -> None:
    steps, topk, ndt = spec
    with TwinBackend(grace_s=2.0) as backend:
        backend.start(twin_launch(tmp_path, steps=steps, topk=topk, ndt=ndt, env=env))
        with pytest.raises(ServerExited) as err:
            backend.wait_ready(poll_s=0.2)
    assert err.value.reason is expected, err.value.log_tail
    assert err.value.returncode is not None


def test_a_launch_file_is_written_on_the_node_and_read_by_the_twin(tmp_path: Path) -> None:
    """A plan's tiers travel as ``LaunchSpec.files``: the node writes them beside the log and
    passes the path after argv (no shell); the twin starts with them as SGLang would."""
    import dataclasses
    import json

    from rayspec.server._command import tiers_json

    base = twin_launch(tmp_path, steps=2, topk=1, ndt=3)
    tiers = ((1, (2,)), (8, (0,)))
    launch = dataclasses.replace(
        base,
        argv=(*base.argv, "--speculative-adaptive"),
        files=(("--speculative-adaptive-config", tiers_json(tiers)),),
    )
    with TwinBackend(grace_s=2.0) as backend:
        backend.start(launch)
        info = backend.wait_ready(poll_s=0.2)
    path = info["speculative_adaptive_config"]
    assert path.startswith(str(tmp_path)) and path.endswith(".json")
    with open(path, encoding="utf-8") as fh:
        assert json.load(fh) == {"1": {"candidate_steps": [2]}, "8": {"candidate_steps": [0]}}
    assert info["speculative_adaptive"] is True
