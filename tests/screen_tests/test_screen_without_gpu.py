"""The real node's NCCL screen on a machine without a GPU: one clear line, not a traceback.

The worker runs under the cached SGLang env's interpreter (it has torch; built by
``.ci/sglang-env``), on this CPU, with the NCCL backend and ``cuda`` ranks it would use on a GPU
node; skipped without that env.
"""

from __future__ import annotations

import os

import pytest

from rayspec import LaunchError
from rayspec.screen import RayNcclScreen
from rayspec.screen import TorchNcclScreen
from tests.contract_tests._sglang import sglang_env_dir

CPU_PYTHON = str(sglang_env_dir() / "bin" / "python")
pytestmark = pytest.mark.skipif(
    not os.access(CPU_PYTHON, os.X_OK),
    reason=f"no interpreter with torch at {CPU_PYTHON} (build it with .ci/sglang-env)",
)


def _no_gpu_here() -> None:
    if os.path.exists("/dev/nvidia0"):
        pytest.skip("this machine has a GPU")


def test_the_worker_says_it_needs_a_gpu() -> None:
    _no_gpu_here()
    screen = TorchNcclScreen(1, python=CPU_PYTHON)
    with pytest.raises(LaunchError) as info:
        screen.measure([{}], [1024], timeout_s=120)
    message = str(info.value)
    assert "\n" not in message
    assert message.endswith("1 ranks need 1 GPUs; 0 visible"), message


def test_through_ray_the_error_is_the_workers_one_line(ray_cluster) -> None:
    _no_gpu_here()
    screen = RayNcclScreen(world_size=1, python=CPU_PYTHON)
    try:
        with pytest.raises(LaunchError) as info:
            screen.measure([{}], [1024], timeout_s=120)
    finally:
        screen.close()
    message = str(info.value)
    assert "\n" not in message and "\x1b[" not in message and "Traceback" not in message
    assert "0 visible" in message, message
