"""The tiny models of the real-SGLang tests: made once per recipe, offline, by the SGLang env.

``_make_models.py`` (run by the env's Python, which has torch, transformers and tokenizers)
writes them; the folder is keyed by a hash of that script, so a changed recipe makes new models
and an unchanged one reuses the cached folder (under ``${RAYSPEC_CACHE:-/var/tmp/rayspec-cache}``,
like the env itself).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.contract_tests._sglang import DEFAULT_CACHE

SCRIPT = Path(__file__).with_name("_make_models.py")
COMPLETE = ".complete"
TIMEOUT_S = 300


@dataclasses.dataclass(frozen=True)
class TinyModels:
    """Model folders ``--model-path`` / ``--speculative-draft-model-path`` take."""

    target: Path  # random Llama with its tokenizer
    draft: Path  # random EAGLE-3 drafter of ``target``
    agree_target: Path  # ``target`` with its final norm zeroed: always picks token 0
    agree_draft: Path  # ``draft`` likewise: always agrees with ``agree_target``


def recipe_key() -> str:
    return hashlib.sha256(SCRIPT.read_bytes()).hexdigest()[:16]


def _models_in(folder: Path) -> TinyModels:
    return TinyModels(
        target=folder / "target",
        draft=folder / "draft",
        agree_target=folder / "agree-target",
        agree_draft=folder / "agree-draft",
    )


def _readable(root: Path) -> None:
    """The cache is shared by the machine's users, like the env (safetensors writes 0600)."""
    for path in [root, *root.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)


def tiny_models(python: Path, cache: Path | None = None) -> TinyModels:
    """The four model folders, made by ``python`` (the SGLang env's) unless cached.

    Raises:
        RuntimeError: the generator failed (its stderr tail in the message).
    """
    root = (cache or Path(os.environ.get("RAYSPEC_CACHE") or DEFAULT_CACHE)) / "real-sglang-models"
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
                f"making the tiny models failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
            )
        (build / "models" / COMPLETE).write_text(recipe_key() + "\n")
        _readable(build / "models")
        try:
            os.rename(build / "models", final)
        except OSError:
            if not (final / COMPLETE).is_file():  # not a concurrent build that won the race
                raise
    finally:
        shutil.rmtree(build, ignore_errors=True)
    return _models_in(final)
