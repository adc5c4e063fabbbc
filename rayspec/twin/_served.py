"""What the twin serves, against what its profile describes.

The twin loads no weights: every timing is its profile's (one model at one TP size, on one
node). ``--model-path`` is read only when it is a local model folder, as SGLang reads it: its
``config.json`` gives the context length (SGLang's rule), the model type and architecture the
twin reports. A model or TP size the profile does not describe is not refused (a study's
trials would all fail on a hint), but said in one line each (:func:`mismatches`): the numbers
are the profile's, whatever the path or the TP size.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from rayspec.engines.sglang import context_length
from rayspec.twin._profile import Profile

CONFIG_MAX_BYTES = 4 * 1024**2  # a model's config.json is kilobytes; a bigger one is not read
PLACEHOLDER_PREFIX = "rayspec-twin/"  # rayspec's --model-path for an empty server.model_path


@dataclasses.dataclass(frozen=True)
class ModelFolder:
    """What a local model folder's ``config.json`` says (None: not there)."""

    path: str
    architecture: str | None
    model_type: str | None
    hidden: int | None
    layers: int | None
    context_len: int | None


def read_model_folder(path: str) -> ModelFolder | None:
    """The facts of ``path`` when it is a folder with a readable, small ``config.json``."""
    config = os.path.join(path, "config.json")
    try:
        if not os.path.isdir(path) or os.path.getsize(config) > CONFIG_MAX_BYTES:
            return None
        with open(config, encoding="utf-8") as fh:
            data: Any = json.load(fh)
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    # SGLang reads a multimodal model's language part (hf_text_config), e.g. Kimi-K2.5's.
    text: dict[str, Any] = data
    if isinstance(data.get("text_config"), dict):
        text = data["text_config"]
    archs = data.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None

    def number(key: str) -> int | None:
        value = text.get(key, data.get(key))
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    model_type = data.get("model_type")
    return ModelFolder(
        path=path,
        architecture=arch,
        model_type=model_type if isinstance(model_type, str) else None,
        hidden=number("hidden_size"),
        layers=number("num_hidden_layers"),
        context_len=context_length(text),
    )


_MODEL_TYPES = {  # HF model_type of the profiles' architectures
    "KimiK25ForConditionalGeneration": "kimi_k25",
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
}


def model_type(profile: Profile, folder: ModelFolder | None) -> str:
    """``/model_info``'s ``model_type``: the folder's, else that of the profile's model."""
    if folder is not None and folder.model_type:
        return folder.model_type
    arch = profile.model.architecture
    return _MODEL_TYPES.get(arch, arch.removesuffix("ForCausalLM").lower())


def describe(profile: Profile) -> str:
    """The model and node a profile's timings are, in a few words."""
    model = profile.model
    return (
        f"profile {profile.name}: {model.architecture}, {model.hidden} hidden, "
        f"{model.layers} layers, TP {profile.hardware.n_ranks}"
    )


def mismatches(
    profile: Profile,
    model_path: str,
    tp_size: int,
    folder: ModelFolder | None = None,
    *,
    names: tuple[str, str, str] = ("--tp-size", "--model-path", " "),
) -> list[str]:
    """One line per way the served model or TP size is not what ``profile`` describes.

    Args:
        profile: the simulated profile.
        model_path: ``--model-path`` (rayspec's ``rayspec-twin/<profile>`` placeholder for a
            study without ``server.model_path`` is the profile's own model).
        tp_size: ``--tp-size``.
        folder: ``read_model_folder(model_path)``, when the caller has read it.
        names: how the lines name the TP size and the model path, and what joins a name to
            its value (the flags; a study's preflight says ``server.tp_size=4``).
    """
    out = []
    tp_name, model_name, sep = names
    ranks = profile.hardware.n_ranks
    if tp_size != ranks:
        out.append(
            f"{tp_name}{sep}{tp_size}: {describe(profile)} describes TP {ranks} only; the "
            f"timings are TP {ranks}'s, not TP {tp_size}'s (use {tp_name}{sep}{ranks}, or a "
            f"profile of TP {tp_size})"
        )
    if model_path.startswith(PLACEHOLDER_PREFIX):
        return out
    folder = folder if folder is not None else read_model_folder(model_path)
    model = profile.model
    if folder is None:
        out.append(
            f"{model_name}{sep}{model_path}: not a local model folder, so not read; the "
            f"timings are those of {describe(profile)}, whatever model the path names"
        )
        return out
    shape = (folder.architecture, folder.hidden, folder.layers)
    if shape != (model.architecture, model.hidden, model.layers):
        out.append(
            f"{model_name}{sep}{model_path}: a {folder.architecture} ({folder.hidden} hidden, "
            f"{folder.layers} layers), not the model of {describe(profile)}; the timings are "
            "the profile's model's"
        )
    return out
