"""``benchmarks/nccl_screen.py`` screens a real-engine experiment without its model paths: the
screen starts no server and reads no model, so it does not ask for them."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from tests.helpers import FIELD_EXPERIMENT
from tests.helpers import REPO


@pytest.mark.skipif(shutil.which("false") is None, reason="needs a `false` command")
def test_a_real_engine_experiment_is_screened_without_model_paths() -> None:
    # A worker interpreter that fails at once: the set is recorded failed, nothing measured;
    # what matters is that the screen got past the experiment to its sets.
    done = subprocess.run(
        [sys.executable, "benchmarks/nccl_screen.py", FIELD_EXPERIMENT, "--backend", "gloo",
         "--device", "cpu", "--world-size", "2", "--worker-python", str(shutil.which("false")),
         "--sizes", "1024", "--max-sets", "1", "--iters", "1", "--warmup", "1"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert "model_path" not in done.stderr + done.stdout
    assert done.returncode == 1, done.stderr  # 1: every set failed (2 would be bad input)
    assert "sizes: --sizes" in done.stdout
    assert "NCCL default: error: exit status 1" in done.stdout
