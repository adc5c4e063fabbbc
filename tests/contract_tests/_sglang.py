"""Shared pieces of the SGLang contract tests: where the env lives, fake models, the probe.

rayspec's own venv never imports SGLang: launch lines go to ``_sglang_probe.py``, run by the
cached SGLang env's Python (built by ``.ci/sglang-env``), in one batch.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rayspec.engines.sglang import CONTRACT_PINNED_VERSIONS

PINNED = CONTRACT_PINNED_VERSIONS[-1]
DEFAULT_CACHE = "/var/tmp/rayspec-cache"
MARKER = ".rayspec-env-complete"  # written by .ci/sglang-env at the end of a good build
PROBE = Path(__file__).with_name("_sglang_probe.py")
PROBE_TIMEOUT_S = 240

# A Llama-like target: resolution reads config.json for the architecture (which picks the
# automatic speculative parameters, docs/sglang.md, *Speculative rules*) and the model's shape.
TARGET_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_hidden_layers": 2,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
# An EAGLE-3 drafter of that target (one decoder layer, a reduced draft vocabulary).
DRAFT_CONFIG: dict[str, Any] = {
    **TARGET_CONFIG,
    "architectures": ["LlamaForCausalLMEagle3"],
    "num_hidden_layers": 1,
    "draft_vocab_size": 32000,
    "max_position_embeddings": 2048,
}


def sglang_env_dir(version: str = PINNED) -> Path:
    """Where ``.ci/sglang-env`` puts the env (the same rule: never under ``$HOME``)."""
    cache = os.environ.get("RAYSPEC_CACHE") or DEFAULT_CACHE
    return Path(cache) / f"sglang-{version}-cpu-serve"


def sglang_python_or_skip() -> Path:
    """The cached SGLang env's Python, or a pytest skip that says how to build the env."""
    import pytest

    env = sglang_env_dir()
    python = env / "bin" / "python"
    if not (env / MARKER).is_file() or not python.exists():
        pytest.skip(
            f"no cached SGLang {PINNED} env at {env} (RAYSPEC_CACHE picks the folder): "
            "build it once with `bash .ci/sglang-env` (about 5 minutes, 7 GB)"
        )
    return python


@dataclasses.dataclass(frozen=True)
class FakeModels:
    target: Path
    draft: Path


@dataclasses.dataclass(frozen=True)
class ProbeCase:
    """One launch line for the probe: the flags after ``python -m sglang.launch_server``."""

    id: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    unset_env: tuple[str, ...] = ()
    # or "launch_server": the real module (rejected lines only); "parse": the parser alone
    entry: str = "prepare"


ProbeRunner = Callable[[Sequence[ProbeCase]], dict[str, dict[str, Any]]]


def run_probe(
    python: Path, cases: Sequence[ProbeCase], workdir: Path
) -> dict[str, dict[str, Any]]:
    """Resolve ``cases`` with SGLang in one process of the SGLang env's ``python``.

    Returns:
        Each case's result by id (see ``_sglang_probe.py``).

    Raises:
        AssertionError: the probe itself failed (not a case: those are results).
    """
    request = workdir / "request.json"
    result = workdir / "result.json"
    payload = [
        {
            "id": c.id,
            "argv": list(c.argv),
            "env": dict(c.env),
            "unset_env": list(c.unset_env),
            "entry": c.entry,
        }
        for c in cases
    ]
    request.write_text(json.dumps({"cases": payload}))
    result.unlink(missing_ok=True)
    proc = subprocess.run(
        [str(python), str(PROBE), str(request), str(result)],
        capture_output=True,
        text=True,
        timeout=PROBE_TIMEOUT_S,
        cwd=workdir,
        # SGLang's env must not see rayspec's venv.
        env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")},
    )
    if proc.returncode != 0 or not result.exists():
        raise AssertionError(
            f"the SGLang probe failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    loaded: dict[str, dict[str, Any]] = json.loads(result.read_text())
    return loaded


def write_fake_models(root: Path) -> FakeModels:
    """A target and an EAGLE-3 draft folder under ``root``, each with only a ``config.json``."""
    folders = {}
    for name, config in (("llama-target", TARGET_CONFIG), ("llama-eagle3-draft", DRAFT_CONFIG)):
        folder = root / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config, indent=1))
        folders[name] = folder
    return FakeModels(target=folders["llama-target"], draft=folders["llama-eagle3-draft"])
