"""Start the twin as a subprocess for tests and benchmarks (a test double, not the real path).

rayspec's server layer launches servers through ``rayspec/server``; this helper exists so the
twin's own tests and ``benchmarks/twin_fidelity.py`` can start a twin with a few lines and look at
it as a client would::

    with TwinProcess(["--tp-size", "8"], env={"NCCL_PROTO": "LL"}) as twin:
        twin.wait_ready()
        httpx.get(twin.base_url + "/server_info").json()

The child gets a copy of this process's environment without any ``NCCL_*`` or ``SGLANG_*``
variable (hermetic), plus ``env``. stdout and stderr go to one log file, as the launcher does.
It starts through ``rayspec._popen.spawn`` like every child of rayspec (one owner of Popen: no
shell, argv a list), in a session of its own, but without a reaper: the harness owns it and
ends it in ``stop`` (its process group), where a test can watch it die.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from collections.abc import Sequence
from types import TracebackType

import httpx

from rayspec._exceptions import FailureReason
from rayspec._exceptions import ServerExited
from rayspec._popen import spawn
from rayspec._tls import shared_ssl_context


class TwinExitedError(ServerExited):
    """The twin exited while a caller waited for it to become ready.

    Attributes:
        returncode: its exit status.
        log: the whole log (``log_tail``: its last 20 lines).
    """

    returncode: int

    def __init__(self, returncode: int, log: str) -> None:
        tail = "\n".join(log.splitlines()[-20:])
        super().__init__(
            f"twin exited with {returncode}; log tail:\n{tail}",
            reason=FailureReason.STARTUP_CRASH,
            log_tail=tail,
            returncode=returncode,
        )
        self.log = log


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_port_block(n: int = 4) -> int:
    """A port p such that p..p+n-1 were free a moment ago on 127.0.0.1 (concurrent studies
    take ``server.port`` + their slot)."""
    for _ in range(50):
        base = free_port()
        if base + n > 65535:
            continue
        try:
            for port in range(base, base + n):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise RuntimeError("no block of free ports found")


class TwinProcess:
    """One twin server process.

    Args:
        args: extra command-line arguments (SGLang flags and ``--twin-*``).
        env: environment variables to set for the child (e.g. NCCL settings).
        startup_s: ``--twin-startup-s`` unless ``args`` gives it.
        model_path: ``--model-path`` unless ``args`` gives it.
        log_path: where the child's output goes (default: a temporary file).
    """

    def __init__(
        self,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        startup_s: float = 0.2,
        model_path: str = "moonshotai/Kimi-K2.5",
        log_path: str | None = None,
    ) -> None:
        self.port = free_port()
        self.host = "127.0.0.1"
        argv = [sys.executable, "-m", "rayspec.twin.server"]
        given = set(args)
        if "--model-path" not in given and "--model" not in given:
            argv += ["--model-path", model_path]
        if "--twin-startup-s" not in given:
            argv += ["--twin-startup-s", str(startup_s)]
        argv += ["--host", self.host, "--port", str(self.port), *args]
        self.argv = argv
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("NCCL_", "SGLANG_", "CUDA_DEVICE_MAX_CONNECTIONS"))
        }
        self.env.update(env or {})
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="rayspec-twin-", suffix=".log")
            os.close(fd)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> TwinProcess:
        """Start the process (no wait)."""
        with open(self.log_path, "wb") as log:
            self.proc = spawn(
                self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, new_session=True
            )
        return self

    def log(self) -> str:
        """Everything the process wrote so far."""
        with open(self.log_path, encoding="utf-8", errors="replace") as fh:
            return fh.read()

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Poll ``/health_generate`` until 200.

        Raises:
            TwinExitedError: the process exited first.
            TimeoutError: not ready within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        with httpx.Client(trust_env=False, timeout=2.0, verify=shared_ssl_context()) as client:
            while time.monotonic() < deadline:
                code = self.poll()
                if code is not None:
                    raise TwinExitedError(code, self.log())
                try:
                    if client.get(self.base_url + "/health_generate").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        raise TimeoutError(f"twin not ready after {timeout_s} s:\n{self.log()[-2000:]}")

    def wait_exit(self, timeout_s: float = 30.0) -> int:
        """Wait for the process to exit and return its exit status.

        Raises:
            subprocess.TimeoutExpired: still running after ``timeout_s``.
        """
        if self.proc is None:
            raise RuntimeError("twin was never started")
        return self.proc.wait(timeout=timeout_s)

    def stop(self, timeout_s: float = 5.0) -> int | None:
        """SIGTERM, wait, then SIGKILL the process group. Returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=timeout_s)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=timeout_s)
        return self.proc.returncode

    def __enter__(self) -> TwinProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
