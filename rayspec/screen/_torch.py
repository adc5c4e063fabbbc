"""The NCCL screen on a real node: the all-reduce microbenchmark, one fresh process per set.

NCCL reads most of its variables once per process, so every environment set gets its own run
of :mod:`rayspec.screen._allreduce` (by file path, under the servers' interpreter), in its own
session: a set that hangs is ended by killing its whole process group, ranks included.

Its children start through ``rayspec._popen.run_to_end`` (the one owner of Popen) rather than a
server's reaper (``rayspec.server._process``): a microbenchmark is short, waited on
synchronously and needs its output, not a reaper and a log file; its ranks end themselves when
their owner dies (see the worker's docstring).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rayspec._exceptions import FailureReason
from rayspec._exceptions import LaunchError
from rayspec._popen import Finished
from rayspec._popen import run_to_end
from rayspec.screen._base import BaseNcclScreen
from rayspec.screen._base import ScreenResult
from rayspec.screen._base import ScreenStatus
from rayspec.screen._base import env_key

__all__ = ["NO_MULTICAST_ENV", "TorchNcclScreen", "WorkerInfo"]


#: Exported to every run, whatever the set says: the screen never creates multicast objects.
NO_MULTICAST_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
# By path, not imported: ``python -m rayspec.screen._allreduce`` imports this package first.
_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_allreduce.py")
_DETAIL_CHARS = 300


@dataclass(frozen=True)
class WorkerInfo:
    """What the worker reported about the machine, from a successful run.

    Attributes:
        world_size: ranks.
        nccl_version: the NCCL torch was built with, e.g. ``2.27.5`` (empty without NCCL).
        torch_version: ``torch.__version__`` of the worker's interpreter.
        backend: the torch.distributed backend.
        device: ``cuda`` or ``cpu``.
        device_name: the GPU's name (rank 0's), or ``cpu``.
        init_s: process group creation and the first all-reduce, seconds.
    """

    world_size: int
    nccl_version: str
    torch_version: str
    backend: str
    device: str
    device_name: str
    init_s: float


class TorchNcclScreen(BaseNcclScreen):
    """All-reduce latency per NCCL environment set, measured with torch.distributed.

    Each set runs the worker once, in a fresh process group of its own, with the environment
    of this process (or ``base_env``) where every ``NCCL_*`` variable is replaced by the set's
    (so nothing leaks in from the node), the set's other variables applied, and multicast always
    off (:data:`NO_MULTICAST_ENV`). A set that asks for NVLink multicast
    (``NCCL_NVLS_ENABLE`` other than 0) is an ``ERROR`` without a run.

    Args:
        world_size: ranks (GPUs on cuda).
        python: the interpreter that runs the worker (it needs torch, nothing of rayspec).
        backend: ``nccl`` on GPUs; ``gloo`` runs the mechanics on a CPU.
        device: ``cuda`` or ``cpu``.
        iters: timed all-reduces per size (the median is reported).
        warmup: untimed all-reduces per size.
        base_env: the environment the sets apply to (default ``os.environ``).
        progress: called with each result as soon as it is measured.

    Raises:
        ValueError: a count is out of range.

    Example::

        screen = TorchNcclScreen(8, python="/opt/sglang/bin/python")
        [r] = screen.measure([{"NCCL_PROTO": "LL"}], [14336, 114688], timeout_s=120)
        r.status, r.latency_us   # ScreenStatus.OK, ((14336, 24.6), (114688, 41.0))
    """

    def __init__(
        self,
        world_size: int,
        *,
        python: str = sys.executable,
        backend: str = "nccl",
        device: str = "cuda",
        iters: int = 50,
        warmup: int = 10,
        base_env: Mapping[str, str] | None = None,
        progress: Callable[[ScreenResult], None] | None = None,
    ) -> None:
        if world_size < 1 or iters < 1 or warmup < 0:
            raise ValueError(
                f"world_size ({world_size}) and iters ({iters}) must be >= 1, "
                f"warmup ({warmup}) >= 0"
            )
        if device not in ("cuda", "cpu"):
            raise ValueError(f"device must be 'cuda' or 'cpu', not {device!r}")
        self.world_size = world_size
        self.python = python
        self.backend = backend
        self.device = device
        self.iters = iters
        self.warmup = warmup
        self._base_env = dict(base_env) if base_env is not None else None
        self._progress = progress
        self.info: WorkerInfo | None = None  # from the first successful run

    # -- what the child gets --------------------------------------------------------------
    def worker_argv(self, sizes_bytes: Sequence[int], timeout_s: float) -> list[str]:
        """The worker's command line (an argv list: no shell)."""
        return [
            self.python,
            _WORKER,
            "--world-size", str(self.world_size),
            "--sizes", ",".join(str(int(s)) for s in sizes_bytes),
            "--iters", str(self.iters),
            "--warmup", str(self.warmup),
            "--backend", self.backend,
            "--device", self.device,
            "--init-timeout-s", f"{max(timeout_s, 1.0):g}",
        ]  # fmt: skip

    def child_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """The exact environment of one set's run."""
        base = os.environ if self._base_env is None else self._base_env
        out = {k: v for k, v in base.items() if not k.startswith("NCCL_")}
        out.update({str(k): str(v) for k, v in env.items()})
        out.update(NO_MULTICAST_ENV)
        return out

    # -- BaseNcclScreen -------------------------------------------------------------------
    def measure(
        self,
        envs: Sequence[Mapping[str, str]],
        sizes_bytes: Sequence[int],
        *,
        timeout_s: float,
    ) -> list[ScreenResult]:
        """See :meth:`BaseNcclScreen.measure`; sets run one after another.

        Raises:
            LaunchError: the worker cannot run on this machine at all (the interpreter does not
                start, has no torch, or there are fewer GPUs than ranks): no set is to blame.
            ValueError: no sizes, or a size below 2 bytes.
        """
        sizes = sorted({int(s) for s in sizes_bytes})
        if not sizes or sizes[0] < 2:
            raise ValueError(f"sizes_bytes must be non-empty and >= 2 bytes, not {sizes_bytes}")
        out = []
        for env in envs:
            result = self._measure_one(env, sizes, timeout_s)
            out.append(result)
            if self._progress is not None:
                self._progress(result)
        return out

    def describe(self) -> str:
        what = "all-reduce microbenchmark"
        if self.device == "cpu":
            return f"{what}, {self.world_size} CPU ranks ({self.backend})"
        gpus = f"{self.world_size} GPU" + ("s" if self.world_size != 1 else "")
        if self.info is not None and self.info.nccl_version and self.backend == "nccl":
            return f"{what}, {gpus}, NCCL {self.info.nccl_version}"
        return f"{what}, {gpus}" + ("" if self.backend == "nccl" else f" ({self.backend})")

    # -- one set --------------------------------------------------------------------------
    def _measure_one(
        self, env: Mapping[str, str], sizes: list[int], timeout_s: float
    ) -> ScreenResult:
        key = env_key({k: v for k, v in env.items() if k.startswith("NCCL_")})
        nvls = env.get("NCCL_NVLS_ENABLE", "0")
        if nvls != "0":
            return ScreenResult(
                key,
                ScreenStatus.ERROR,
                detail=f"NCCL_NVLS_ENABLE={nvls}: the screen never creates NVLink multicast "
                "objects, so this set is not measured",
            )
        run = self._run(self.worker_argv(sizes, timeout_s), self.child_env(env), timeout_s)
        if run.returncode is None:
            last = _last_line(run.stderr)
            return ScreenResult(
                key,
                ScreenStatus.HANG,
                detail=f"no result within {timeout_s:g} s; its process group was killed"
                + (f" (last output: {last})" if last else ""),
                elapsed_s=run.elapsed_s,
            )
        from rayspec.screen._allreduce import EXIT_UNUSABLE

        if run.returncode == EXIT_UNUSABLE:
            raise LaunchError(
                f"the NCCL screen cannot run with {self.python}: {_unusable_detail(run)}",
                reason=FailureReason.UNKNOWN,
                log_tail="\n".join(run.stderr.splitlines()[-20:]),
                returncode=run.returncode,
            )
        data = _result_line(run.stdout) if run.returncode == 0 else None
        if data is None:
            return ScreenResult(
                key, ScreenStatus.ERROR, detail=_error_detail(run), elapsed_s=run.elapsed_s
            )
        latency = tuple(sorted((int(n), float(t)) for n, t in data["latency_us"]))
        if self.info is None:
            self.info = _info(data)
        return ScreenResult(key, ScreenStatus.OK, latency, elapsed_s=run.elapsed_s)

    def _run(self, argv: list[str], env: dict[str, str], timeout_s: float) -> Finished:
        return run_to_end(argv, env, timeout_s, what="the NCCL screen's worker")


def _result_line(stdout: str) -> dict[str, Any] | None:
    """The worker's JSON line (the last one: NCCL_DEBUG=INFO also writes to stdout)."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get("latency_us"), list):
            return data
    return None


def _info(data: Mapping[str, Any]) -> WorkerInfo:
    return WorkerInfo(
        world_size=int(data.get("world_size", 0)),
        nccl_version=str(data.get("nccl_version", "")),
        torch_version=str(data.get("torch", "")),
        backend=str(data.get("backend", "")),
        device=str(data.get("device", "")),
        device_name=str(data.get("device_name", "")),
        init_s=float(data.get("init_s", 0.0)),
    )


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:_DETAIL_CHARS] if lines else ""


def _message_lines(text: str) -> list[str]:
    """Non-empty lines of ``text``, stripped, without a traceback's source lines and carets."""
    out: list[str] = []
    after_frame = False
    for raw in text.splitlines():
        line = raw.strip()
        source = after_frame and raw.startswith("    ")
        after_frame = raw.startswith('  File "')
        if line and not source and not set(line) <= set("^~ "):
            out.append(line)
    return out


def _error_detail(run: Finished) -> str:
    """The line that says why: NCCL's own error first, then the exception, then the last line."""
    lines = _message_lines(run.stderr)
    pick = next((ln for ln in lines if "NCCL error" in ln), "")
    if pick:
        # torch puts NCCL's own reason below its message: "Last error:", then the text.
        tail = lines[lines.index(pick) + 1 : lines.index(pick) + 4]
        if "Last error:" in tail[:-1]:
            pick += " | " + tail[tail.index("Last error:") + 1]
    # NCCL_DEBUG output goes to stdout unless NCCL_DEBUG_FILE says otherwise.
    warns = [ln for ln in (*lines, *_message_lines(run.stdout)) if "NCCL WARN" in ln]
    pick = pick or (warns[-1] if warns else "")
    pick = pick or next((ln for ln in reversed(lines) if _is_exception_line(ln)), "")
    pick = pick or (lines[-1] if lines else "")
    status = _status(run.returncode)
    text = f"{pick} ({status})" if pick else status
    return text if len(text) <= _DETAIL_CHARS else text[: _DETAIL_CHARS - 1] + "…"


def _unusable_detail(run: Finished) -> str:
    """Why the machine cannot run the benchmark: the rank's own ``cannot run here:`` line
    (e.g. ``1 ranks need 1 GPUs; 0 visible``), not the launcher's exit-status line after it."""
    from rayspec.screen._allreduce import UNUSABLE_MARK

    for line in _message_lines(run.stderr):
        _, mark, why = line.partition(UNUSABLE_MARK)
        if mark and why.strip():
            return why.strip()
    return _error_detail(run)


def _is_exception_line(line: str) -> bool:
    head, sep, _ = line.partition(": ")
    name = head.rsplit(".", 1)[-1]
    return bool(sep) and name.isidentifier() and name.endswith(("Error", "Exception"))


def _status(returncode: int | None) -> str:
    if returncode is not None and returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
    return f"exit status {returncode}"
