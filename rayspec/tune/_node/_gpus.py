"""The node's GPUs, through NVML: visible, free enough, as many as the TP size."""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from typing import Protocol
from typing import cast

from rayspec._plural import plural
from rayspec.tune._node._findings import Findings

GiB = 1024**3
#: A GPU counts as busy above min(2 GiB, 10 % of its memory): an idle one holds well under
#: 1 GiB, and SGLang sizes its pool from total memory, so a stranger's share means OOM.
BUSY_GPU_BYTES = 2 * GiB
BUSY_GPU_FRACTION = 0.10


class Nvml(Protocol):
    """The few NVML calls preflight makes (the ``pynvml`` module has them all).

    Tests pass a small fake with the same names; nothing else is ever called.
    """

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> Sequence[Any]: ...
    def nvmlSystemGetProcessName(self, pid: int) -> str | bytes: ...


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    used_bytes: int | None  # None: NVML cannot tell (e.g. another container's process)


@dataclass(frozen=True)
class GpuState:
    """One GPU as NVML sees it (``index`` is NVML's, in PCI bus order)."""

    index: int
    uuid: str
    used_bytes: int
    total_bytes: int
    processes: tuple[GpuProcess, ...] = ()


def load_nvml() -> Nvml | None:
    """The ``pynvml`` module (package ``nvidia-ml-py``), or None when it is not installed."""
    try:
        return cast(Nvml, importlib.import_module("pynvml"))
    except ImportError:
        return None


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def read_gpus(nvml: Nvml) -> list[GpuState]:
    """Every GPU's memory and compute processes.

    Raises:
        nvml.NVMLError: NVML cannot start (no driver) or a GPU cannot be read.
    """
    nvml.nvmlInit()
    try:
        gpus = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            procs = []
            for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                try:
                    name = _text(nvml.nvmlSystemGetProcessName(proc.pid))
                except nvml.NVMLError:
                    name = "?"  # a process NVML cannot name (gone, or not ours to see)
                used = getattr(proc, "usedGpuMemory", None)
                procs.append(GpuProcess(int(proc.pid), os.path.basename(name), used))
            gpus.append(
                GpuState(
                    index=index,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    used_bytes=int(mem.used),
                    total_bytes=int(mem.total),
                    processes=tuple(procs),
                )
            )
        return gpus
    finally:
        nvml.nvmlShutdown()


def visible_gpus(gpus: Sequence[GpuState], cuda_visible: str | None) -> tuple[list[GpuState], str]:
    """The GPUs CUDA (and so Ray) sees under ``CUDA_VISIBLE_DEVICES``, in its order.

    Entries are CUDA ordinals or ``GPU-`` UUID prefixes; like CUDA, the list stops at the
    first entry that names no GPU. Ordinals are taken as NVML indices: CUDA's default order
    equals PCI bus order on a node of identical GPUs (exactly so with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``).

    Returns:
        The visible GPUs, and a warning when the GPU checks cannot follow the variable (MIG).
    """
    if cuda_visible is None:
        return list(gpus), ""
    shown: list[GpuState] = []
    for entry in (e.strip() for e in cuda_visible.split(",")):
        if entry.startswith("MIG-"):
            return [], "GPU checks skipped: CUDA_VISIBLE_DEVICES names MIG devices"
        if entry.isdigit():
            match = [g for g in gpus if g.index == int(entry)]
        else:
            match = [g for g in gpus if entry and g.uuid.startswith(entry)]
        if len(match) != 1 or match[0] in shown:
            break
        shown.append(match[0])
    return shown, ""


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


def check_gpus(
    gpus: Sequence[GpuState],
    *,
    tp_size: int,
    num_gpus: int | None,
    cuda_visible: str | None,
) -> Findings:
    """Enough visible GPUs for one server, and none of those Ray may hand out already in use.

    Args:
        gpus: the visible GPUs (:func:`visible_gpus`).
        tp_size: ``server.tp_size``, the GPUs one server needs.
        num_gpus: ``cluster.num_gpus``: Ray then hands out the first that many.
        cuda_visible: ``CUDA_VISIBLE_DEVICES`` (for the messages).
    """
    out = Findings()
    seen = "unset" if cuda_visible is None else repr(cuda_visible)
    if num_gpus is not None and num_gpus > len(gpus):
        out.problems.append(
            f"cluster.num_gpus: {num_gpus} but this node shows {plural(len(gpus), 'GPU')} "
            f"(CUDA_VISIBLE_DEVICES {seen}); servers would be given GPUs that do not exist"
        )
    usable = list(gpus if num_gpus is None else gpus[:num_gpus])
    if len(usable) < tp_size:
        out.problems.append(
            f"server.tp_size: a server needs {plural(tp_size, 'GPU')} and this node shows "
            f"{len(usable)} "
            f"(CUDA_VISIBLE_DEVICES {seen}); lower server.tp_size or run on a larger node"
        )
    # Ray assigns GPU ids without looking at memory: any busy one may land in a trial.
    for gpu in usable:
        if gpu.used_bytes <= min(BUSY_GPU_BYTES, BUSY_GPU_FRACTION * gpu.total_bytes):
            continue
        holders = ", ".join(
            f"pid {p.pid} {p.name}" + (f" {_gib(p.used_bytes)}" if p.used_bytes else "")
            for p in gpu.processes
        )
        out.problems.append(
            f"CUDA_VISIBLE_DEVICES: GPU {gpu.index} already has {_gib(gpu.used_bytes)} of "
            f"{_gib(gpu.total_bytes)} in use by "
            f"{holders or 'no process visible from here (another container?)'}; stop it, "
            f"or leave GPU {gpu.index} out of CUDA_VISIBLE_DEVICES (now {seen})"
        )
    return out
