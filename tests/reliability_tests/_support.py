"""Helpers for the reliability tests: experiments on the twin, /proc scans, a driver subprocess;
small twin studies run in-process on the twin's model (:class:`rayspec.testing.SimulatedTrials`,
no Ray), and the invariants of a study folder.

Everything here polls with a bounded deadline; nothing measures time.
"""

from __future__ import annotations

import hashlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pyarrow.parquet as pq

from rayspec._config import ExperimentConfig
from rayspec._config import load_config
from tests.helpers import REPO
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import free_port_block
from tests.helpers import write_experiment

SUBPROCESS_ENV = {
    **os.environ,
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    "PYTHONUNBUFFERED": "1",
}

# A small bench on a fast twin: faults show in seconds.
SMALL_BENCH = {"warmup": 1, "repeats": 1, "max_tokens": 20, "read_timeout_s": 2}


def experiment(
    out_dir: str,
    *,
    name: str,
    port: int,
    n_trials: int,
    enqueue: list[dict[str, Any]] | None = None,
    flags: dict[str, list[str]] | None = None,
    bench: dict[str, Any] | None = None,
    server: dict[str, Any] | None = None,
    cluster: dict[str, Any] | None = None,
    nccl: dict[str, list[str]] | None = None,
    sampler: str = "random",
) -> str:
    """Write a twin experiment under ``out_dir`` and return its path."""
    doc: dict[str, Any] = {
        "study": {
            "name": name,
            "n_trials": n_trials,
            "sampler": sampler,
            "seed": 0,
            "enqueue": list(enqueue or []),
        },
        "cluster": {"include_dashboard": False, **(cluster or {})},
        "server": {
            "engine": "twin",
            "tp_size": 8,
            "port": port,
            "startup_timeout_s": 8,
            "stop_timeout_s": 10,
            "twin": {"startup_s": 0.2},
            **(server or {}),
        },
        "search": {
            "nccl": nccl
            if nccl is not None
            else {
                "NCCL_PROTO": ["unset", "LL", "Simple"],
                "NCCL_ALGO": ["unset", "Ring", "Tree"],
            },
            "speculative": {
                "modes": ["off", "EAGLE3"],
                "num_steps": [1, 2, 3],
                "eagle_topk": [1, 2],
                "num_draft_tokens": [2, 3, 4],
            },
            "flags": dict(flags or {}),
        },
        "bench": {**SMALL_BENCH, **(bench or {})},
        "output": {"dir": out_dir},
    }
    return write_experiment(out_dir, doc, name=f"{name}.yaml")


# -- processes ------------------------------------------------------------------------------


def processes_with(*needles: str) -> dict[int, str]:
    """Live (non-zombie) processes whose command line contains any of ``needles``."""
    found: dict[int, str] = {}
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                raw = fh.read()
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2 :].split()[0] in ("Z", "X"):
            continue
        line = raw.replace(b"\0", b" ").decode(errors="replace").strip()
        if any(n in line for n in needles):
            found[int(entry)] = line
    return found


def descendants(root: int | None = None) -> set[int]:
    """Live processes under ``root`` (default: this one), e.g. the workers of the test
    session's own Ray cluster: the only ones a test may kill on a shared machine."""
    parent: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        parent[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    mine, grew = {root or os.getpid()}, True
    while grew:
        more = {pid for pid, ppid in parent.items() if ppid in mine} - mine
        grew = bool(more)
        mine |= more
    mine.discard(root or os.getpid())
    return mine


def wait_no_processes(*needles: str, timeout_s: float = 15.0) -> dict[int, str]:
    """Poll /proc until nothing matches ``needles`` (bounded); the survivors, if any."""
    end = time.monotonic() + timeout_s
    while True:
        left = processes_with(*needles)
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.1)


def kill_leftovers(*needles: str) -> None:
    """Test hygiene: SIGKILL whatever a failed check left behind (only our own processes)."""
    for pid in processes_with(*needles):
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


# -- the driver as a subprocess -------------------------------------------------------------


class Driver:
    """``python -m rayspec.tune`` in its own session, its output read line by line."""

    def __init__(self, args: list[str]) -> None:
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rayspec.tune", *args],
            cwd=REPO,
            env=SUBPROCESS_ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, pattern: str, timeout_s: float) -> str | None:
        """The first new line matching ``pattern``, or None at the deadline or exit."""
        rx = re.compile(pattern)
        end = time.monotonic() + timeout_s
        while True:
            remaining = end - time.monotonic()
            if remaining <= 0:
                return None
            try:
                line = self._queue.get(timeout=remaining)
            except queue.Empty:
                return None
            if line is None:
                self._queue.put(None)  # keep the end marker for later calls
                return None
            self.lines.append(line)
            if rx.search(line):
                return line

    def signal(self, sig: int) -> None:
        try:
            os.kill(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout_s: float) -> int | None:
        """The exit code, or None if it still runs at the deadline."""
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        self._reader.join(timeout=5)
        while True:
            try:
                line = self._queue.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.lines.append(line)
        return code

    def wait_progressing(self, quiet_s: float = 120.0) -> int | None:
        """The exit code, waiting as long as the driver prints; None once it ran ``quiet_s``
        without a new line (stuck, not slow: a loaded machine only makes it print later)."""
        while True:
            try:
                line = self._queue.get(timeout=quiet_s)
            except queue.Empty:
                return None if self.proc.poll() is None else self.wait(30)
            if line is None:  # its output closed: it is exiting
                self._queue.put(None)
                return self.wait(quiet_s)
            self.lines.append(line)

    def kill_session(self) -> None:
        """SIGKILL the driver's whole session (cleanup after a failed check)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def output(self) -> str:
        return "\n".join(self.lines[-80:])


# -- in-process studies and the folder's invariants -------------------------------------------

FAST = ["bench.repeats=2", "bench.max_tokens=40", "cluster.include_dashboard=false"]


def twin_cfg(out: str, *extra: str) -> ExperimentConfig:
    """The quickstart's twin experiment, small: ``study.max_restarts`` etc. in ``extra``."""
    return load_config(
        TWIN_EXPERIMENT, [f"output.dir={out}", f"server.port={free_port_block()}", *FAST, *extra]
    )


def quiet(_line: str) -> None:
    pass


def journal_trials(cfg: ExperimentConfig) -> dict[int, Any]:
    """The journal's trials (FrozenTrial by number), read as Optuna reads them."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(cfg.storage_url))
    study = optuna.load_study(study_name=cfg.study.name, storage=storage)
    return {t.number: t for t in study.get_trials(deepcopy=False)}


def row_hashes(cfg: ExperimentConfig) -> dict[int, str]:
    """trial -> a hash of its trial row's measured content (what must never be overwritten)."""
    folder = os.path.join(cfg.out_dir, "trials")
    out: dict[int, str] = {}
    if not os.path.isdir(folder):
        return out
    for name in sorted(os.listdir(folder)):
        if not (name.startswith("trial-") and name.endswith(".parquet")):
            continue
        row = pq.read_table(os.path.join(folder, name)).to_pylist()[0]
        kept = (row["state"], row["value"], row["start_unix_s"], row["run_values"],
                row["candidate_key"], row["role"])  # fmt: skip
        out[int(row["trial"])] = hashlib.sha256(repr(kept).encode()).hexdigest()
    return out
