"""Preflight of a real node: what can be checked before the first restart, without the model.

Every check is a pure function over plain data (a version string, a parsed ``config.json``, a
list of :class:`GpuState`) returning :class:`Findings`: problems (each one line that names the
key, then what to do) and warnings (printed; the study goes on). The probes that gather that
data are thin and injected through :class:`NodeProbes`, so tests use a fake version probe and a
fake NVML, never SGLang or a GPU.

:func:`check_node` runs only for ``server.engine: sglang`` on a local cluster (an empty
``cluster.address``): it inspects *this* machine. On a remote cluster (``cluster.address`` set)
the servers run on other nodes, so nothing here is checked there: not SGLang's import or
version on the workers, not the model and draft folders, not the drafter's layer ids, not
the workers' GPUs. :func:`check_nccl_values` is a property of NCCL, not of a node, and runs
for every real-engine study.

Hub ids (``org/name``) are not checked: only paths that look local (``/``, ``./``, ``../``,
``~``, or an existing path) are opened. Nothing is downloaded.

Example::

    findings = check_node(cfg, default_probes())
    for line in findings.warnings:
        print(f"warning: {line}")
    if findings.problems:
        raise ConfigError(...)
"""

from __future__ import annotations

from rayspec.engines.sglang import InstalledSGLang
from rayspec.engines.sglang import default_capture_ids
from rayspec.engines.sglang import probe_sglang
from rayspec.tune._node._check import NodeProbes
from rayspec.tune._node._check import check_node
from rayspec.tune._node._check import default_probes
from rayspec.tune._node._eagle import check_aux_layers
from rayspec.tune._node._findings import Findings
from rayspec.tune._node._gpus import GpuProcess
from rayspec.tune._node._gpus import GpuState
from rayspec.tune._node._gpus import Nvml
from rayspec.tune._node._gpus import check_gpus
from rayspec.tune._node._gpus import load_nvml
from rayspec.tune._node._gpus import read_gpus
from rayspec.tune._node._gpus import visible_gpus
from rayspec.tune._node._models import ModelInfo
from rayspec.tune._node._models import check_context_length
from rayspec.tune._node._models import read_model
from rayspec.tune._node._nccl import check_nccl_values
from rayspec.tune._node._sglang import check_sglang

__all__ = [
    "Findings",
    "GpuProcess",
    "GpuState",
    "InstalledSGLang",
    "ModelInfo",
    "NodeProbes",
    "Nvml",
    "check_aux_layers",
    "check_context_length",
    "check_gpus",
    "check_nccl_values",
    "check_node",
    "check_sglang",
    "default_capture_ids",
    "default_probes",
    "load_nvml",
    "probe_sglang",
    "read_gpus",
    "read_model",
    "visible_gpus",
]
