"""The NCCL screen of a real node, on the CPU: gloo ranks under a cached interpreter with torch.

The worker (``rayspec/screen/_allreduce.py``) runs under ``CPU_PYTHON`` (built by
``.ci/sglang-env``); the tests that need it are skipped when it is missing. No GPU needed.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
import uuid
from pathlib import Path

import pytest

from rayspec import LaunchError
from rayspec.screen import RayNcclScreen
from rayspec.screen import ScreenStatus
from rayspec.screen import TorchNcclScreen
from rayspec.screen import TwinNcclScreen
from rayspec.screen import _allreduce
from rayspec.screen._torch import NO_MULTICAST_ENV
from rayspec.screen._torch import _result_line
from tests.contract_tests._sglang import sglang_env_dir

CPU_PYTHON = str(sglang_env_dir() / "bin" / "python")
needs_torch = pytest.mark.skipif(
    not os.access(CPU_PYTHON, os.X_OK),
    reason=f"no CPU interpreter with torch at {CPU_PYTHON} (build it with .ci/sglang-env)",
)
EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
SIZES = [1024, 4 << 20, 32 << 20]  # far apart: gloo on two busy cores is noisy


def _gloo(python: str = CPU_PYTHON) -> TorchNcclScreen:
    return TorchNcclScreen(2, python=python, backend="gloo", device="cpu", iters=3, warmup=1)


def _interpreter_double(tmp_path: Path, real: str, log: Path, *flags: str) -> str:
    """An executable standing in for ``python``: logs its environment and process group, then
    becomes ``real flags...`` with the same arguments."""
    path = tmp_path / "python-double"
    path.write_text(
        f"#!{real}\n"
        "import json, os, sys\n"
        f"with open({str(log)!r}, 'a') as fh:\n"
        "    fh.write(json.dumps({'env': dict(os.environ),\n"
        "                         'group_leader': os.getpgrp() == os.getpid()}) + '\\n')\n"
        f"os.execv({real!r}, [{real!r}, *{list(flags)!r}, *sys.argv[1:]])\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _processes_with(token: str) -> list[int]:
    """Live processes whose environment holds ``token`` (the test's hook value)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if token.encode() in fh.read() and _alive(int(name)):
                    found.append(int(name))
        except OSError:
            continue
    return found


# -- no process needed ---------------------------------------------------------------------
def test_the_child_gets_the_sets_nccl_variables_exactly_and_multicast_off() -> None:
    node = {"PATH": "/bin", "NCCL_PROTO": "Simple", "NCCL_DEBUG": "INFO", "NCCL_NVLS_ENABLE": "1"}
    screen = TorchNcclScreen(8, base_env=node)
    env = screen.child_env({"NCCL_ALGO": "Ring", "SGLANG_X": "1"})
    assert env == {"PATH": "/bin", "NCCL_ALGO": "Ring", "SGLANG_X": "1", **NO_MULTICAST_ENV}
    assert NO_MULTICAST_ENV == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                "NVSHMEM_DISABLE_NVLS": "1"}  # fmt: skip
    argv = screen.worker_argv([14336, 43008], timeout_s=60)
    assert argv[:2] == [sys.executable, os.path.abspath(_allreduce.__file__)]
    assert argv[argv.index("--sizes") + 1] == "14336,43008"
    assert argv[argv.index("--world-size") + 1] == "8"


def test_a_multicast_set_is_an_error_and_never_runs() -> None:
    screen = TorchNcclScreen(2, python="/nonexistent/python")  # a run would raise LaunchError
    [r] = screen.measure([{"NCCL_NVLS_ENABLE": "1"}], [1024], timeout_s=5)
    assert r.status is ScreenStatus.ERROR and "multicast" in r.detail


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        TorchNcclScreen(0)
    with pytest.raises(ValueError):
        TorchNcclScreen(2, device="tpu")
    with pytest.raises(ValueError):
        TorchNcclScreen(2).measure([{}], [], timeout_s=5)
    assert _allreduce.main(["--world-size", "0", "--sizes", "1024"]) == _allreduce.EXIT_USAGE
    assert _allreduce.main(["--world-size", "2", "--sizes", "1k"]) == _allreduce.EXIT_USAGE


def test_the_result_line_is_found_among_nccl_debug_output() -> None:
    out = 'host:1:1 [0] NCCL INFO Bootstrap\n{"latency_us": [[1024, 5.0]]}\nhost NCCL INFO x\n'
    assert _result_line(out) == {"latency_us": [[1024, 5.0]]}
    assert _result_line("no json\n{broken\n") is None


def test_the_real_engine_gets_the_ray_screen() -> None:
    from rayspec._config import load_config
    from rayspec.tune._screen import _make_screen

    overrides = ["server.model_path=/m", "server.draft_model_path=/d",
                 "server.python=/opt/sg/bin/python"]  # fmt: skip
    cfg = load_config(str(EXPERIMENTS / "eagle3.yaml"), overrides)
    screen = _make_screen(cfg)
    assert isinstance(screen, RayNcclScreen)
    assert (screen.world_size, screen.python) == (8, "/opt/sg/bin/python")
    assert screen.describe() == "all-reduce microbenchmark, 8 GPUs"
    twin = _make_screen(load_config(str(EXPERIMENTS / "eagle3-twin.yaml")))
    assert isinstance(twin, TwinNcclScreen)


# -- the worker, on the CPU ----------------------------------------------------------------
@needs_torch
def test_sets_are_measured_in_fresh_process_groups_with_their_own_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NCCL_ALGO", "Tree")  # on the node, in no set: must not leak in
    log = tmp_path / "runs.jsonl"
    screen = _gloo(_interpreter_double(tmp_path, CPU_PYTHON, log))
    ok, failed = screen.measure(
        [{"NCCL_PROTO": "LL"}, {"NCCL_PROTO": "Simple", _allreduce.FAIL_VAR: "1"}],
        SIZES, timeout_s=60,
    )  # fmt: skip
    assert ok.status is ScreenStatus.OK and ok.env == (("NCCL_PROTO", "LL"),)
    assert [s for s, _ in ok.latency_us] == SIZES
    latencies = [t for _, t in ok.latency_us]
    assert all(t > 0 for t in latencies) and latencies == sorted(latencies), ok.latency_us
    assert ok.elapsed_s > 0.5  # the process start and the process group are counted
    assert failed.status is ScreenStatus.ERROR and "invalid usage" in failed.detail
    assert failed.elapsed_s > 0
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(runs) == 2 and all(run["group_leader"] for run in runs)  # one session per set
    for run, proto in zip(runs, ["LL", "Simple"], strict=True):
        env = run["env"]
        assert {k: env[k] for k in NO_MULTICAST_ENV} == NO_MULTICAST_ENV
        assert env["NCCL_PROTO"] == proto and "NCCL_ALGO" not in env
    assert screen.info is not None and screen.info.world_size == 2
    assert screen.describe() == "all-reduce microbenchmark, 2 CPU ranks (gloo)"


@needs_torch
def test_a_hanging_set_is_killed_with_its_whole_process_group(tmp_path: Path) -> None:
    pids = tmp_path / f"hang-{uuid.uuid4().hex}"
    pids.mkdir()
    t0 = time.monotonic()
    [r] = _gloo().measure([{_allreduce.HANG_VAR: str(pids)}], SIZES, timeout_s=3)
    took_s = time.monotonic() - t0
    assert r.status is ScreenStatus.HANG and "3 s" in r.detail
    assert 3 <= r.elapsed_s <= took_s  # it returned: the timeout ended the hang (no bound on
    # how long the kill took: a loaded machine may take longer, and nothing asserts wall time)
    ranks = [int(p.read_text()) for p in sorted(pids.iterdir())]
    assert len(ranks) == 2  # both ranks were up (and sleeping) when the timeout struck
    assert not [pid for pid in ranks if _alive(pid)]
    assert _processes_with(str(pids)) == []  # the worker's main process too


def test_a_node_that_cannot_run_the_worker_raises(tmp_path: Path) -> None:
    # -I -S: no site-packages, so no torch: the machine's fault, not the set's.
    python = _interpreter_double(tmp_path, sys.executable, tmp_path / "log", "-I", "-S")
    with pytest.raises(LaunchError, match="torch is not importable"):
        _gloo(python).measure([{}], [1024], timeout_s=30)


# -- as Ray work ---------------------------------------------------------------------------
@needs_torch
def test_the_ray_screen_holds_the_gpus_while_it_measures(ray_cluster: None) -> None:
    import ray

    screen = RayNcclScreen(2, python=CPU_PYTHON, backend="gloo", device="cpu", iters=2, warmup=1)
    try:
        [r] = screen.measure([{"NCCL_PROTO": "LL"}], [1024, 4 << 20], timeout_s=60)
        assert r.status is ScreenStatus.OK and len(r.latency_us) == 2
        assert ray.available_resources().get("GPU", 0) <= 6  # the actor holds world_size GPUs
        assert screen.describe() == "all-reduce microbenchmark, 2 CPU ranks (gloo)"
    finally:
        screen.close()
    deadline = time.monotonic() + 20
    while ray.available_resources().get("GPU", 0) < 8 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("GPU", 0) == 8
    screen.close()  # idempotent
