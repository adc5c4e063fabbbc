"""Start the real SGLang server on this CPU for a test, and make sure it is gone afterwards.

The scaffolding comes in through the environment only (``scaffold_env``), so the command is the
one rayspec itself launches: ``<env python> -m sglang.launch_server`` and flags.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path

import httpx

from rayspec.server._process import process_tree
from tests.helpers import free_port
from tests.helpers import pids_alive

SITE = Path(__file__).with_name("_site")
# The ready wait is counted in the CPU seconds the server's processes spent, not in wall
# seconds: a server on a loaded machine (the other xdist worker, a benchmark beside it) gets a
# fraction of a core and took 157 s of wall time to start plain at load 7, 45 s when quiet.
# Its CPU time to get ready is about the same either way. The wall clock only bounds a server
# that is starved entirely (READY_WALL_FACTOR times as long).
READY_TIMEOUT_S = 180.0
READY_WALL_FACTOR = 5.0
STOP_TIMEOUT_S = 20.0
# The CPU path, small models and quiet idling (sglang-cpu notes in docs/real-sglang-cpu.md).
# What a rayspec study passes in server.extra_flags (rayspec adds --enable-metrics itself).
CPU_SERVER_FLAGS = (
    "--device",
    "cpu",
    "--disable-overlap-schedule",
    "--max-total-tokens",
    "4096",
    "--sleep-on-idle",
)
CPU_FLAGS = (*CPU_SERVER_FLAGS, "--enable-metrics")


def scaffold_env(fake_amx: bool = True, site_log: Path | None = None) -> dict[str, str]:
    """The environment the real server needs on this CPU, beyond the caller's own.

    ``PYTHONPATH`` gains the ``sgl_kernel`` stand-in and ``sitecustomize`` (``_site/``); with
    ``fake_amx`` SGLang is told the CPU has AMX, so that ``--attention-backend intel_amx`` (and
    with it EAGLE) stays on. ``site_log`` names a file each Python that loaded the scaffolding
    appends its pid to.
    """
    path = [str(SITE)]
    if os.environ.get("PYTHONPATH"):
        path.append(os.environ["PYTHONPATH"])
    env = {
        "PYTHONPATH": os.pathsep.join(path),
        "SGLANG_USE_CPU_ENGINE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        # SGLang's EAGLE v2 path wraps helpers in torch.compile; on a CPU inductor then builds
        # C++ for every new shape (seconds each, decode at ~5 tok/s). Eager is the same maths.
        "TORCHDYNAMO_DISABLE": "1",
        # One OpenMP thread: the models are tiny, and on a shared 2-core machine two threads
        # spin at every barrier (40 tokens took 10-17 s with two threads, 0.4 s with one).
        "OMP_NUM_THREADS": "1",
        # Register only the tiny models' modules (sitecustomize.py): start-up ~7 s faster per
        # process that imports SGLang's model registry.
        "RAYSPEC_TEST_MODEL_MODULES": "llama,llama_eagle3",
    }
    if fake_amx:
        env["RAYSPEC_TEST_FAKE_AMX"] = "1"
    if site_log is not None:
        env["RAYSPEC_TEST_SITE_LOG"] = str(site_log)
    return env


def launch_argv(python: Path, flags: Sequence[str], port: int) -> list[str]:
    """``python -m sglang.launch_server`` with ``flags``, the CPU flags it lacks, and the port."""
    argv = [str(python), "-m", "sglang.launch_server", *flags]
    for i in range(0, len(CPU_FLAGS)):
        flag = CPU_FLAGS[i]
        if flag.startswith("--") and flag not in flags:
            takes_value = i + 1 < len(CPU_FLAGS) and not CPU_FLAGS[i + 1].startswith("--")
            argv += [flag, CPU_FLAGS[i + 1]] if takes_value else [flag]
    return [*argv, "--host", "127.0.0.1", "--port", str(port)]


RealServer = Callable[..., contextlib.AbstractContextManager[tuple[str, Path]]]


class ServerFailed(AssertionError):
    """The server exited or never answered ``/health_generate``; the message has its log tail."""


@contextlib.contextmanager
def real_server(
    python: Path,
    flags: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    ready_timeout_s: float = READY_TIMEOUT_S,
    stopped: list[int] | None = None,
) -> Iterator[tuple[str, Path]]:
    """A running real SGLang server: yields ``(base_url, log_path)`` once it is ready.

    On exit the server's whole process tree (scheduler, detokenizer, ...) is stopped: SIGTERM to
    its process group, SIGKILL after ``STOP_TIMEOUT_S``, then SIGKILL to any descendant seen that
    left the group. ``stopped`` (if given) receives every pid of the tree that was seen.
    """
    port = free_port()
    child_env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    child_env.update(scaffold_env())
    child_env.update(env or {})
    log = open(log_path, "ab")
    proc = subprocess.Popen(
        launch_argv(python, flags, port),
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=child_env,
        start_new_session=True,  # its own process group: one signal reaches every child
    )
    seen: set[int] = {proc.pid}
    try:
        base_url = f"http://127.0.0.1:{port}"
        _wait_ready(proc, base_url, log_path, ready_timeout_s, seen)
        yield base_url, log_path
        seen.update(process_tree(proc.pid))
    finally:
        seen.update(process_tree(proc.pid))
        _stop(proc, seen)
        log.close()
        if stopped is not None:
            stopped.extend(sorted(seen))


def log_tail(log_path: Path, lines: int = 40) -> str:
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of one process (None once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_ready(
    proc: subprocess.Popen[bytes],
    base_url: str,
    log_path: Path,
    timeout_s: float,
    seen: set[int],
) -> None:
    """Wait for ``/health_generate``: at most ``timeout_s`` CPU seconds of the server's process
    tree (each process's last reading kept once it exits), and ``READY_WALL_FACTOR`` times
    that in wall time."""
    wall_deadline = time.monotonic() + READY_WALL_FACTOR * timeout_s
    spent: dict[int, float] = {}
    with httpx.Client(timeout=10.0) as client:
        while time.monotonic() < wall_deadline and sum(spent.values()) < timeout_s:
            seen.update(process_tree(proc.pid))
            for pid in process_tree(proc.pid):
                cpu = _cpu_s(pid)
                if cpu is not None:
                    spent[pid] = cpu
            if proc.poll() is not None:
                raise ServerFailed(
                    f"SGLang exited with {proc.returncode} before it was ready; log tail:\n"
                    + log_tail(log_path)
                )
            try:
                if client.get(f"{base_url}/health_generate").status_code == 200:
                    seen.update(process_tree(proc.pid))
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
    raise ServerFailed(
        f"SGLang did not answer /health_generate after {sum(spent.values()):.0f} CPU s of its "
        f"processes (limit {timeout_s:.0f}; {READY_WALL_FACTOR * timeout_s:.0f} s of wall time "
        "at most); log tail:\n" + log_tail(log_path)
    )


def _stop(proc: subprocess.Popen[bytes], seen: set[int]) -> None:
    # SIGTERM to the server alone: SGLang then stops its own children. (A group-wide SIGTERM
    # makes it take the dying scheduler for a crash and wait 5 s for diagnostics.)
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pass
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while pids_alive(seen) and time.monotonic() < deadline:
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in pids_alive(seen):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
