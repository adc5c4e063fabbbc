"""A twin study's best.sh is the real SGLang launch (it needs GPUs); best-twin.sh beside it
serves the same configuration on the twin, on the machine the study ran on."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx

from rayspec._config import load_config
from rayspec.results import write_best
from rayspec.store import StudyFolder
from tests.helpers import free_port
from tests.report_tests.conftest import simulated_study


def test_best_twin_sh_serves_the_pick_on_the_twin(tmp_path) -> None:
    made = simulated_study(str(tmp_path), max_restarts=3)
    port = free_port()
    cfg = load_config(os.path.join(tmp_path, "exp.yaml"), [f"server.port={port}"])
    paths = write_best(cfg, made.outcome.report)
    assert paths is not None
    with open(paths[1], encoding="utf-8") as fh:
        best_sh = fh.read()
    twin_sh = StudyFolder(made.out_dir).best_twin_sh
    with open(twin_sh, encoding="utf-8") as fh:
        twin_text = fh.read()
    assert "-m sglang.launch_server" in best_sh
    assert "best-twin.sh beside this file serves it" in best_sh
    assert "-m rayspec.twin.server" in twin_text and "sglang.launch_server" not in twin_text
    # The same flags as best.sh's SGLang line, model paths and the twin's own flags aside.
    sglang_flags = best_sh.splitlines()[-1].split("launch_server", 1)[1].split()
    twin_flags = twin_text.splitlines()[-1].split("rayspec.twin.server", 1)[1].split()
    for flag in (f for f in sglang_flags if f.startswith("--") and "model-path" not in f):
        assert flag in twin_flags, flag
    assert [x for x in best_sh.splitlines() if x.startswith("export ")] == [
        x for x in twin_text.splitlines() if x.startswith("export ")
    ]
    # And it serves, here.
    proc = subprocess.Popen(
        ["bash", twin_sh], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline, ready = time.monotonic() + 60, False
        with httpx.Client(trust_env=False, timeout=2.0) as client:
            while not ready and time.monotonic() < deadline and proc.poll() is None:
                try:
                    ready = client.get(f"http://127.0.0.1:{port}/health_generate").is_success
                except httpx.TransportError:
                    time.sleep(0.1)
        assert ready, proc.stderr.read().decode()[-2000:] if proc.poll() is not None else "hung"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_a_real_study_has_no_twin_script(tmp_path) -> None:
    made = simulated_study(str(tmp_path), max_restarts=3)
    cfg = load_config(os.path.join(tmp_path, "exp.yaml"))
    assert write_best(cfg, made.outcome.report) is not None
    assert os.path.exists(StudyFolder(made.out_dir).best_twin_sh)
    real = load_config(
        os.path.join(tmp_path, "exp.yaml"),
        ["server.engine=sglang", "server.model_path=/m", "server.draft_model_path=/d"],
    )
    assert write_best(real, made.outcome.report) is not None
    assert not os.path.exists(StudyFolder(made.out_dir).best_twin_sh)
