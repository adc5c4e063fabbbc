"""Real studies: ``python -m rayspec.tune`` (a subprocess, as a user runs it) against the real
SGLang server on this CPU, with faults injected from outside while it runs.

A study folder is read back with pyarrow only. Faults are applied to a trial by number, found
through its log file (``logs/trial-NNNNNN.log``, written before its server starts) and the
process tree of the reaper whose command line names that log: the server and its children are
found by ancestry, never by process name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import yaml

from rayspec.server import _reaper
from rayspec.server._process import process_tree
from tests.helpers import pids_alive
from tests.real_sglang._server import CPU_SERVER_FLAGS

REPO = Path(__file__).resolve().parents[2]
# The CPU path (docs/real-sglang-cpu.md): no CUDA device, no overlap scheduler on CPU, a small KV
# pool for the tiny models, and a scheduler that sleeps when idle instead of spinning a core.
CPU_FLAGS = list(CPU_SERVER_FLAGS)
READY_LINE = "The server is fired up and ready to roll!"
FLUSH_LINE = "Cache flushed successfully!"
POLL_S = 0.2


def experiment(
    *,
    name: str,
    out_dir: Path,
    python: Path,
    target: Path,
    draft: Path,
    port: int,
    env: Mapping[str, str],
    enqueue: list[dict[str, Any]],
    max_restarts: int,
    num_steps: list[int],
    eagle_topk: list[int],
    num_draft_tokens: list[int],
    nccl: Mapping[str, list[str]] | None = None,
) -> dict[str, Any]:
    """A real-engine experiment for this CPU: tp 1 on one fake Ray GPU, the CPU flags through
    ``server.extra_flags``, the scaffolding through ``server.env``, a short protocol."""
    return {
        "study": {
            "name": name,
            "max_restarts": max_restarts,
            "sampler": "structured",
            "seed": 0,
            "pruning": False,
            "enqueue": enqueue,
        },
        # The ServerActor asks for tp_size GPUs: a CPU machine declares one to its private Ray.
        "cluster": {"num_gpus": 1, "num_cpus": 4, "include_dashboard": False},
        "server": {
            "engine": "sglang",
            "python": str(python),
            "model_path": str(target),
            "draft_model_path": str(draft),
            "tp_size": 1,
            "port": port,
            # The one CPU backend with an EAGLE path (the AMX override of the scaffolding).
            "attention_backend": "intel_amx",
            "max_running_requests": 4,
            "enable_metrics": True,
            "sglang_version": "0.5.23",
            # A decode-log window every 10 steps (default 40): SGLang's own accept length
            # (/server_info, /metrics, the Decode batch lines) exists only once a window has
            # completed, and a 32-token run at accept length 3 is 11 verify steps.
            "extra_flags": [*CPU_FLAGS, "--decode-log-interval", "10"],
            "env": dict(env),
            "startup_timeout_s": 300,
            "stop_timeout_s": 30,
        },
        "search": {
            "nccl": dict(nccl or {}),
            "speculative": {
                "modes": ["off", "EAGLE3"],
                "num_steps": num_steps,
                "eagle_topk": eagle_topk,
                "num_draft_tokens": num_draft_tokens,
            },
        },
        "bench": {
            "warmup": 1,
            "repeats": 2,
            "max_repeats": 2,
            "max_tokens": 32,
            "gate_tokens": 16,
            "read_timeout_s": 20,
            "request_timeout_s": 180,
        },
        "output": {"dir": str(out_dir)},
    }


def write_yaml(path: Path, doc: Mapping[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(dict(doc), sort_keys=False))
    return path


def driver_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The driver's environment: this one, without the test venv's PYTHONPATH leaking in."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env.update(extra or {})
    return env


def start_study(yaml_path: Path, log: Path, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
    """``python -m rayspec.tune <yaml>`` in its own session (so the test can kill it whole)."""
    return subprocess.Popen(
        [sys.executable, "-m", "rayspec.tune", str(yaml_path)],
        cwd=str(REPO),
        stdout=open(log, "wb"),  # noqa: SIM115  (closed with the process)
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=dict(env),
        start_new_session=True,
    )


def trial_log(folder: Path, trial: int) -> Path:
    return folder / "logs" / f"trial-{trial:06d}.log"


def read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def reaper_pid(log_path: Path) -> int | None:
    """The reaper whose command line names ``log_path`` (one per trial), or None."""
    want = os.fsencode(str(log_path))
    script = os.fsencode(_reaper.__file__)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                args = fh.read().split(b"\0")
        except OSError:
            continue
        if script in args and want in args:
            return int(entry)
    return None


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def server_pids(log_path: Path) -> tuple[int, list[int]]:
    """The SGLang server (the reaper's child) and its descendants, or (0, []) when gone."""
    reaper = reaper_pid(log_path)
    if reaper is None:
        return 0, []
    tree = process_tree(reaper)[1:]
    return (tree[0], tree) if tree else (0, [])


def scheduler_pid(log_path: Path) -> int:
    """SGLang's scheduler: the child of the server whose (setproctitle) title says so."""
    server, tree = server_pids(log_path)
    for pid in tree[1:]:
        if "scheduler" in cmdline(pid):
            return pid
    return 0


@dataclasses.dataclass
class Fault:
    """What to do to one trial, and what happened."""

    trial: int
    when: Callable[[str], bool]  # called with the trial's log text
    act: Callable[[Path], str]  # called with the trial's log path; says what it did
    done: str = ""
    tree: list[int] = dataclasses.field(default_factory=list)  # the server's pids at the fault


def measuring(text: str) -> bool:
    """The benchmark's measured runs have begun: the cache was flushed and the warm-up plus one
    more request reached the server."""
    after = text.split(FLUSH_LINE, 1)
    return len(after) == 2 and after[1].count('"POST /generate') >= 2


def launched(text: str) -> bool:
    return text.startswith("[rayspec] launch:")


def exited(text: str) -> bool:
    return _reaper.EXIT_LINE_PREFIX in text


def kill_scheduler(log_path: Path) -> str:
    pid = scheduler_pid(log_path)
    if not pid:
        return "no scheduler found"
    os.kill(pid, signal.SIGKILL)
    return f"SIGKILL scheduler {pid}"


def stop_scheduler(log_path: Path) -> str:
    pid = scheduler_pid(log_path)
    if not pid:
        return "no scheduler found"
    os.kill(pid, signal.SIGSTOP)
    return f"SIGSTOP scheduler {pid}"


class Injector(threading.Thread):
    """Watches a study folder and applies each fault once its condition holds."""

    def __init__(self, folder: Path, faults: list[Fault]) -> None:
        super().__init__(daemon=True)
        self.folder = folder
        self.faults = faults
        self.stop_event = threading.Event()

    def run(self) -> None:
        pending = list(self.faults)
        while pending and not self.stop_event.is_set():
            for fault in list(pending):
                path = trial_log(self.folder, fault.trial)
                text = read_text(path)
                if text and fault.when(text):
                    fault.tree = server_pids(path)[1]
                    try:
                        fault.done = fault.act(path) or "done"
                    except OSError as exc:
                        fault.done = f"failed: {exc}"
                    pending.remove(fault)
            self.stop_event.wait(POLL_S)


class PortHolder:
    """A stranger listening on ``127.0.0.1:port`` from :meth:`take` until :meth:`give_back`."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock: socket.socket | None = None

    def take(self, _log: Path) -> str:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(1)
        self.sock = sock
        return f"listening on {self.port}"

    def give_back(self, _log: Path) -> str:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        return f"closed {self.port}"


def wait_for(check: Callable[[], bool], timeout_s: float, poll_s: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(poll_s)
    return check()


def trials(folder: Path) -> dict[int, dict[str, Any]]:
    """The study's trial rows by trial number."""
    path = folder / "trials"
    if not path.is_dir():
        return {}
    return {int(r["trial"]): r for r in pq.read_table(path).to_pylist()}


def requests(folder: Path) -> list[dict[str, Any]]:
    path = folder / "requests"
    return pq.read_table(path).to_pylist() if path.is_dir() else []


def alive(pids: list[int]) -> list[int]:
    return pids_alive(pids)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)
