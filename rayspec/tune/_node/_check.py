"""All of it, for one local node: :func:`check_node` and the probes it uses."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass

from rayspec._config import SPEC_OFF
from rayspec._config import ExperimentConfig
from rayspec.engines.sglang import InstalledSGLang
from rayspec.engines.sglang import probe_sglang
from rayspec.tune._node._eagle import check_aux_layers
from rayspec.tune._node._findings import Findings
from rayspec.tune._node._gpus import Nvml
from rayspec.tune._node._gpus import check_gpus
from rayspec.tune._node._gpus import load_nvml
from rayspec.tune._node._gpus import read_gpus
from rayspec.tune._node._gpus import visible_gpus
from rayspec.tune._node._models import check_context_length
from rayspec.tune._node._models import read_model
from rayspec.tune._node._sglang import check_sglang


@dataclass(frozen=True)
class NodeProbes:
    """How preflight looks at the node; tests pass fakes.

    Attributes:
        sglang: asks an interpreter for SGLang's version (:func:`probe_sglang`).
        nvml: returns NVML, or None when ``pynvml`` is not installed (:func:`load_nvml`).
    """

    sglang: Callable[[str, Mapping[str, str]], InstalledSGLang]
    nvml: Callable[[], Nvml | None]


def default_probes() -> NodeProbes:
    """The real probes: a subprocess of the server's interpreter, and ``pynvml``."""
    return NodeProbes(sglang=probe_sglang, nvml=load_nvml)


def check_node(
    cfg: ExperimentConfig, probes: NodeProbes, environ: Mapping[str, str] | None = None
) -> Findings:
    """Everything about this node a real-engine study needs, short of loading the model.

    Args:
        cfg: the experiment (``server.engine: sglang``, a local cluster).
        probes: how to ask SGLang and NVML.
        environ: the node's environment (default ``os.environ``).
    """
    env = dict(os.environ if environ is None else environ)
    srv = cfg.server
    out = Findings()
    python = srv.python or sys.executable
    found = probes.sglang(python, {**env, **srv.env})
    key = "server.python" if srv.python else "server.engine"
    out.extend(check_sglang(found, python=python, configured=srv.sglang_version, key=key))

    target, found_target = read_model("server.model_path", srv.model_path)
    draft, found_draft = read_model("server.draft_model_path", srv.draft_model_path)
    out.extend(found_target)
    out.extend(found_draft)
    modes = cfg.search.speculative.modes
    if any(m != SPEC_OFF for m in modes):
        out.extend(
            check_context_length(
                target, draft, extra_flags=srv.extra_flags, env={**env, **srv.env}
            )
        )
    if "EAGLE3" in modes and target is not None and draft is not None:
        out.extend(check_aux_layers(target, draft))

    nvml = probes.nvml()
    if nvml is None:
        out.warnings.append(
            "GPU checks skipped: pynvml is not installed (pip install 'rayspec[gpu]')"
        )
        return out
    try:
        gpus = read_gpus(nvml)
    except nvml.NVMLError as exc:
        out.warnings.append(f"GPU checks skipped: NVML is not usable here ({exc})")
        return out
    cuda_visible = env.get("CUDA_VISIBLE_DEVICES")
    shown, note = visible_gpus(gpus, cuda_visible)
    if note:
        out.warnings.append(note)
        return out
    out.extend(
        check_gpus(
            shown, tp_size=srv.tp_size, num_gpus=cfg.cluster.num_gpus, cuda_visible=cuda_visible
        )
    )
    return out
