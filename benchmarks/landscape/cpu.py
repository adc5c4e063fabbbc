"""The real SGLang server on this CPU as a rayspec experiment: what the recorder and the live
studies launch (docs/landscapes.md).

Everything CPU-specific is ordinary config, as in the real-SGLang tests
(docs/real-sglang-cpu.md): the SGLang env's interpreter in ``server.python``, the CPU flags in
``server.extra_flags``, the test scaffolding (the ``sgl_kernel`` stand-in, the AMX override, one
OpenMP thread) in ``server.env``, tp 1 on one GPU declared to Ray. The speculative space comes
from ``benchmarks/spaces/cpu-landscape.yaml``, merged over this base.
"""

from __future__ import annotations

import copy
import os
import platform
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from benchmarks.landscape.models import DEFAULT_CACHE
from benchmarks.landscape.models import LandscapeModels
from rayspec._config import ExperimentConfig
from rayspec._config import load_config
from rayspec._types import Candidate
from rayspec.search import SearchSpace
from tests.real_sglang._server import CPU_SERVER_FLAGS
from tests.real_sglang._server import scaffold_env

ROOT = Path(__file__).resolve().parents[2]
SPACE = ROOT / "benchmarks" / "spaces" / "cpu-landscape.yaml"
SGLANG_VERSION = "0.5.23"
# The models are float32 (docs/landscapes.md: MKL's small-M sgemm and the bf16 path on this CPU).
EXTRA_FLAGS = [*CPU_SERVER_FLAGS, "--dtype", "float32"]
MAX_TOKENS = 96
WARMUP = 1
RUNS = 8


def sglang_python() -> Path:
    cache = Path(os.environ.get("RAYSPEC_CACHE") or DEFAULT_CACHE)
    return cache / f"sglang-{SGLANG_VERSION}-cpu-serve" / "bin" / "python"


def base_experiment(
    models: LandscapeModels,
    drafter: str,
    *,
    name: str,
    out_dir: Path,
    port: int = 30000,
    python: Path | None = None,
) -> dict[str, Any]:
    """The experiment (as YAML data) of one drafter's landscape, without its search space."""
    return {
        "study": {"name": name, "sampler": "structured", "seed": 0, "pruning": False},
        # The ServerActor asks for tp_size GPUs: a CPU machine declares one to its private Ray.
        "cluster": {"num_gpus": 1, "num_cpus": 2, "include_dashboard": False},
        "server": {
            "engine": "sglang",
            "python": str(python or sglang_python()),
            "model_path": str(models.target),
            "draft_model_path": str(models.drafters[drafter]),
            "tp_size": 1,
            "port": port,
            "attention_backend": "intel_amx",  # the one CPU backend with an EAGLE path
            "max_running_requests": 4,
            "enable_metrics": True,
            "sglang_version": SGLANG_VERSION,
            "extra_flags": list(EXTRA_FLAGS),
            "env": scaffold_env(),
            "startup_timeout_s": 900,
            "stop_timeout_s": 30,
        },
        "bench": {
            "warmup": WARMUP,
            "repeats": RUNS,
            "max_repeats": RUNS,
            "max_tokens": MAX_TOKENS,
            "read_timeout_s": 120,
            "request_timeout_s": 900,
        },
        "output": {"dir": str(out_dir)},
    }


def merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` merged into a copy of ``base``, mappings recursively."""
    out = copy.deepcopy(dict(base))
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def experiment_with_space(base: Mapping[str, Any], space: Path = SPACE) -> dict[str, Any]:
    return merged(base, yaml.safe_load(space.read_text()))


def load_experiment(
    doc: Mapping[str, Any], overrides: list[str] | None = None
) -> ExperimentConfig:
    """``doc`` read as rayspec reads an experiment file (``load_config``)."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as fh:
        yaml.safe_dump(dict(doc), fh, sort_keys=False)
    try:
        return load_config(fh.name, overrides or [])
    finally:
        os.unlink(fh.name)


def settings(cfg: ExperimentConfig) -> list[Candidate]:
    """Every launchable setting of the experiment's space (no speculation first)."""
    space = SearchSpace.from_config(cfg.search)
    return [space.candidate(p) for p in space.grid_points()]


def machine() -> dict[str, Any]:
    model = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu_model": model, "cores": os.cpu_count(), "machine": platform.machine()}


def installed_version(python: Path, package: str = "sglang") -> str:
    code = f"from importlib.metadata import version; print(version({package!r}))"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120)
    return out.stdout.strip() or "unknown"
