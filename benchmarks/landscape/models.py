"""The CPU landscape's models: made once per recipe, offline, by the SGLang env's Python.

``make_models.py`` (run by the env's interpreter, which has torch and transformers) writes them;
the folder is keyed by a hash of that script, so a changed recipe makes new models and an
unchanged one reuses the cached folder under ``${RAYSPEC_CACHE:-/var/tmp/rayspec-cache}``.
The real-SGLang tests' models (``tests/real_sglang/_models.py``) are a recipe of their own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).with_name("make_models.py")
DEFAULT_CACHE = "/var/tmp/rayspec-cache"
COMPLETE = ".complete"
TIMEOUT_S = 600


@dataclasses.dataclass(frozen=True)
class LandscapeModels:
    """The target folder and one EAGLE-3 drafter folder per drafter name."""

    recipe: str  # the hash of make_models.py that made them
    target: Path
    drafters: dict[str, Path]

    def shape(self) -> dict[str, Any]:
        """The target's and a drafter's shape, from their config.json files."""
        keys = (
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "vocab_size",
            "torch_dtype",
            "dtype",
        )
        target = json.loads((self.target / "config.json").read_text())
        draft = json.loads((next(iter(self.drafters.values())) / "config.json").read_text())
        return {
            "target": {k: target[k] for k in keys if k in target},
            "draft": {k: draft[k] for k in keys if k in draft},
        }


def recipe_key() -> str:
    return hashlib.sha256(SCRIPT.read_bytes()).hexdigest()[:16]


def _models_in(folder: Path) -> LandscapeModels:
    drafters = {
        p.name.removeprefix("draft-"): p
        for p in sorted(folder.iterdir())
        if p.name[:6] == "draft-"
    }
    return LandscapeModels(recipe=recipe_key(), target=folder / "target", drafters=drafters)


def landscape_models(python: Path, cache: Path | None = None) -> LandscapeModels:
    """The model folders, made by ``python`` (the SGLang env's) unless cached.

    Raises:
        RuntimeError: the generator failed (its stderr tail in the message).
    """
    root = (cache or Path(os.environ.get("RAYSPEC_CACHE") or DEFAULT_CACHE)) / "landscape-models"
    final = root / recipe_key()
    if (final / COMPLETE).is_file():
        return _models_in(final)
    root.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=".build.", dir=root))
    try:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
        proc = subprocess.run(
            [str(python), str(SCRIPT), str(build / "models")],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=env,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"making the landscape models failed (exit {proc.returncode}):\n"
                f"{proc.stderr[-3000:]}"
            )
        (build / "models" / COMPLETE).write_text(recipe_key() + "\n")
        for path in [build / "models", *(build / "models").rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)  # shared by the machine's users
        try:
            os.rename(build / "models", final)
        except OSError:
            if not (final / COMPLETE).is_file():  # not a concurrent build that won the race
                raise
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return _models_in(final)
