"""Every fault the twin can inject, in one study: recorded as a classified FAIL, the study goes
on, and the next trial's server starts cleanly (port free, nothing of the last trial left).

One study runs all faults in sequence (a healthy baseline first, a healthy EAGLE-3 trial last);
each faulty configuration is an enqueued value of a searched flag (``--twin-fault``) or of an
NCCL variable, so every faulty trial is followed by another trial of the same study. A wrapper
around ``run_trial`` checks the port and /proc before and after each trial.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass
from typing import Any

import pytest

from rayspec._exceptions import FailureReason
from rayspec._exceptions import ServerExited
from rayspec._types import LaunchSpec
from tests.helpers import free_port
from tests.reliability_tests._support import experiment
from tests.reliability_tests._support import kill_leftovers
from tests.reliability_tests._support import processes_with
from tests.reliability_tests._support import wait_no_processes

# (what is injected, the enqueued parameters, the expected reason, a line the log tail must
# hold: SGLang's own failure text, docs/sglang.md, *Failure texts*, or None where there is none)
FAULTS: list[tuple[str, dict[str, Any], str, str | None]] = [
    ("crash-startup", {"flags.--twin-fault": "crash-startup"}, "startup_crash",
     "Scheduler hit an exception"),
    ("oom", {"flags.--twin-fault": "oom"}, "out_of_memory", "CUDA out of memory"),
    ("oom:kv", {"flags.--twin-fault": "oom:kv"}, "out_of_memory",
     "Not enough memory. Please try to increase --mem-fraction-static"),
    ("graph-capture", {"flags.--twin-fault": "graph-capture"}, "cuda_graph_capture",
     "Capture cuda graph failed"),
    ("NCCL_PROTO=LL256", {"nccl.NCCL_PROTO": "LL256"}, "nccl_init", "ncclInvalidUsage"),
    ("NCCL_ALGO=CollNetDirect", {"nccl.NCCL_ALGO": "CollNetDirect"}, "nccl_first_collective",
     "NCCL_ALGO was set to CollNetDirect"),
    ("never-ready", {"flags.--twin-fault": "never-ready"}, "never_ready", None),
    # counted from ready: the bench's warm-up takes 20 tokens, so it dies in the measured run
    ("crash-after:30", {"flags.--twin-fault": "crash-after:30"}, "crash_mid_benchmark",
     "Scheduler hit an exception"),
    ("stall:30", {"flags.--twin-fault": "stall:30"}, "stalled_stream", None),
    # ndt - 1 = 3 > topk + (steps - 1) * topk**2 = 2: never launched
    ("invalid draft tree",
     {"spec.mode": "EAGLE3", "spec.num_steps": 1, "spec.eagle_topk": 2,
      "spec.num_draft_tokens": 4}, "infeasible", None),
    # ndt 3 < steps + 1 = 4: the tree's accepted path does not fit its block (SGLang 0.5.23)
    ("draft tree short of its path",
     {"spec.mode": "EAGLE3", "spec.num_steps": 3, "spec.eagle_topk": 2,
      "spec.num_draft_tokens": 3}, "infeasible", "accepted path of 4 tokens"),
]  # fmt: skip
HEALTHY_LAST = {"spec.mode": "EAGLE3", "spec.num_steps": 2, "spec.eagle_topk": 1}
FAULT_IDS = [f[0] for f in FAULTS]


@dataclass
class TrialCheck:
    port_free_before: bool
    left_before: dict[int, str]
    left_after: dict[int, str]


@dataclass
class FaultStudy:
    port: int
    out_dir: str
    storage: str
    study_name: str
    rows: dict[int, dict[str, Any]]
    checks: dict[int, TrialCheck]
    lines: list[str]


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def fault_study(ray_cluster, tmp_path_factory) -> FaultStudy:
    from rayspec._config import load_config
    from rayspec.store import ParquetTrialStore
    from rayspec.tune import run_study
    from rayspec.tune._trial import run_trial

    folder = str(tmp_path_factory.mktemp("faults"))
    port = free_port()
    path = experiment(
        folder,
        name="faults",
        port=port,
        n_trials=len(FAULTS) + 2,
        enqueue=[params for _, params, _, _ in FAULTS] + [HEALTHY_LAST],
        flags={"--twin-fault": ["off", *(p["flags.--twin-fault"] for _, p, _, _ in FAULTS
                                        if "flags.--twin-fault" in p)]},
        nccl={"NCCL_PROTO": ["unset", "LL", "LL256"], "NCCL_ALGO": ["unset", "Ring",
                                                                  "CollNetDirect"]},
    )  # fmt: skip
    cfg = load_config(path, [])
    needles = (cfg.out_dir, f"--port {port} ")
    checks: dict[int, TrialCheck] = {}

    def checked_trial(cfg_: Any, number: int, candidate: Any, **kwargs: Any) -> Any:
        free = _port_free(port)
        before = processes_with(*needles)
        try:
            return run_trial(cfg_, number, candidate, **kwargs)
        finally:
            checks[number] = TrialCheck(free, before, wait_no_processes(*needles))

    lines: list[str] = []
    try:
        run_study(cfg, printer=lines.append, trial_fn=checked_trial)
    finally:
        kill_leftovers(*needles)
    rows = {int(r["trial"]): r for r in ParquetTrialStore(cfg.out_dir).load_trials().to_pylist()}
    return FaultStudy(port, cfg.out_dir, cfg.storage_url, cfg.study.name, rows, checks, lines)


def _optuna_trials(fs: FaultStudy) -> dict[int, Any]:
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    study = optuna.load_study(
        study_name=fs.study_name, storage=JournalStorage(JournalFileBackend(fs.storage))
    )
    return {t.number: t for t in study.get_trials(deepcopy=False)}


def test_the_study_ran_every_trial_in_order(fault_study: FaultStudy) -> None:
    fs = fault_study
    n = len(FAULTS) + 2
    assert sorted(fs.rows) == list(range(n)), fs.lines[-20:]
    assert sorted(os.listdir(os.path.join(fs.out_dir, "trials"))) == [
        f"trial-{i:06d}.parquet" for i in range(n)
    ]
    assert fs.rows[0]["state"] == "COMPLETE" and fs.rows[0]["value"] > 0  # the baseline
    last = fs.rows[n - 1]
    assert last["state"] == "COMPLETE" and last["value"] > 0, last["failure_detail"]
    assert last["spec_num_steps"] == 2
    assert any(line.startswith("[restart ") and f"trial {n - 1}" in line for line in fs.lines)


@pytest.mark.parametrize("index", range(len(FAULTS)), ids=FAULT_IDS)
def test_fault_is_a_classified_fail_with_the_log_tail(fault_study: FaultStudy, index) -> None:
    what, params, reason, marker = FAULTS[index]
    number = index + 1  # the baseline is trial 0
    row = fault_study.rows[number]
    assert row["state"] == "FAIL", (what, row["failure_detail"])
    assert row["value"] is None
    assert row["failure"] == reason, (what, row["failure"], row["failure_detail"])
    assert row["failure_detail"]
    trial = _optuna_trials(fault_study)[number]
    # A configuration that cannot run is told to Optuna as infeasible (constraint failed = 1),
    # which its samplers learn from; rayspec's state stays FAIL.
    assert trial.state.name == "COMPLETE" and trial.constraints == {"failed": 1.0}
    assert trial.user_attrs["state"] == "FAIL"
    assert trial.user_attrs["failure_reason"] == reason
    if reason == "infeasible":  # decided before launch: no server, no log
        assert row["command"] is None and not row["log_tail"]
        assert "not launched" in row["failure_detail"]
        assert marker is None or marker in row["failure_detail"], row["failure_detail"]
        log = os.path.join(fault_study.out_dir, "logs", f"trial-{number:06d}.log")
        assert not os.path.exists(log)
        return
    tail = row["log_tail"] or ""
    assert tail.strip(), f"{what}: empty log tail"
    assert trial.user_attrs["log_tail"] == tail[-4000:]
    if marker is not None:
        assert marker in tail, f"{what}: {marker!r} not in the log tail:\n{tail[-1500:]}"
    if reason == "stalled_stream":
        assert "no chunk" in row["failure_detail"]


@pytest.mark.parametrize("index", range(len(FAULTS)), ids=FAULT_IDS)
def test_next_trial_starts_cleanly_and_nothing_survives(fault_study: FaultStudy, index) -> None:
    """The faulty trial left no process; the trial after it found the port free and bound it."""
    number = index + 1
    fs = fault_study
    if FAULTS[index][2] != "infeasible":
        assert number in fs.checks, "the faulty trial was not launched"
        assert fs.checks[number].left_after == {}, fs.checks[number].left_after
    following = min(n for n in fs.checks if n > number)  # the next launched trial
    check = fs.checks[following]
    assert check.port_free_before, f"port {fs.port} still taken when trial {following} started"
    assert check.left_before == {}, check.left_before
    log = os.path.join(fs.out_dir, "logs", f"trial-{following:06d}.log")
    with open(log) as fh:
        text = fh.read()
    assert text.startswith("[rayspec] launch: ")
    assert "simulated SGLang" in text  # the server itself ran, with a fresh log
    assert "error while attempting to bind" not in text
    assert fs.rows[following]["failure"] != FailureReason.UNKNOWN.value


def test_failure_detail_is_the_servers_message(fault_study: FaultStudy) -> None:
    for index, (what, _, reason, _) in enumerate(FAULTS):
        if reason in ("infeasible", "crash_mid_benchmark", "stalled_stream"):
            continue  # decided by the driver or the bench: their own message already
        detail = fault_study.rows[index + 1]["failure_detail"]
        assert "\x1b[" not in detail and "Traceback" not in detail, (what, detail[:300])
        assert detail.startswith("twin server "), (what, detail[:300])


# -- the server level: an invalid draft tree is classified by the server layer too -----------


def test_invalid_draft_tree_launched_directly_is_classified(ray_cluster, tmp_path) -> None:
    """The driver never launches it; launched anyway, it fails at warm-up as SGLang does."""
    import ray

    from rayspec.server import ServerActor

    port = free_port()
    argv = (
        sys.executable, "-m", "rayspec.twin.server",
        "--model-path", "rayspec-twin/kimi-k2.5-tp8-pcie", "--tp-size", "8",
        "--host", "127.0.0.1", "--port", str(port),
        "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "draft",
        "--speculative-num-steps", "1", "--speculative-eagle-topk", "2",
        "--speculative-num-draft-tokens", "8", "--twin-startup-s", "0.2",
    )  # fmt: skip
    launch = LaunchSpec(
        argv=argv, env=(), host="127.0.0.1", port=port,
        log_path=str(tmp_path / "tree.log"), startup_timeout_s=30.0, engine="twin",
    )  # fmt: skip
    actor = ServerActor.options(num_gpus=8).remote(grace_s=3.0)
    try:
        ray.get(actor.start.remote(launch))
        with pytest.raises(ServerExited) as info:
            ray.get(actor.wait_ready.remote(), timeout=60)
        assert info.value.reason is FailureReason.INVALID_DRAFT_TREE
        assert "selected index k out of range" in info.value.log_tail
        ray.get(actor.stop.remote(), timeout=30)
    finally:
        ray.kill(actor)
    assert wait_no_processes(f"--port {port} ", str(tmp_path)) == {}


# -- a fault of the driver itself ----------------------------------------------------------


def test_a_searched_flag_without_off_does_not_crash_the_study(tmp_path) -> None:
    from rayspec._config import load_config
    from rayspec.store import ParquetTrialStore
    from rayspec.tune import run_study
    from rayspec.tune._preflight import preflight
    from tests.reliability_tests.test_resume import _fake_trial

    path = experiment(
        str(tmp_path), name="flags", port=free_port(), n_trials=3,
        flags={"--chunked-prefill-size": ["4096", "8192"]},
    )  # fmt: skip
    cfg = load_config(path, [])
    preflight(cfg)  # accepted as valid input
    run_study(cfg, printer=lambda _s: None, trial_fn=_fake_trial)
    rows = ParquetTrialStore(cfg.out_dir).load_trials().to_pylist()
    assert len(rows) == 3
