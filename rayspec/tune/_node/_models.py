"""The model and draft folders: their config.json, and the context length a drafter needs."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rayspec.engines import SGLANG
from rayspec.engines.sglang import CONTEXT_LENGTH_FLAG
from rayspec.engines.sglang import LONGER_CONTEXT_ENV
from rayspec.tune._node._findings import Findings


@dataclass(frozen=True)
class ModelInfo:
    """What preflight reads from a local model's ``config.json``.

    Attributes:
        path: the folder.
        config: the whole file.
        architecture: ``architectures[0]``, or None.
        num_layers: ``num_hidden_layers`` (under ``text_config`` for multimodal configs).
        context_len: SGLang's derived context length, or None when no key gives it.
    """

    path: str
    config: Mapping[str, Any]
    architecture: str | None
    num_layers: int | None
    context_len: int | None


def looks_local(path: str) -> bool:
    """Whether SGLang would read ``path`` from disk rather than resolve it as a hub id."""
    return path.startswith(("/", "./", "../", "~")) or os.path.exists(path)


def read_model(key: str, path: str) -> tuple[ModelInfo | None, Findings]:
    """Read ``path/config.json`` when ``path`` looks local; hub ids are not checked.

    Returns:
        The model's info (None for a hub id, a single-file checkpoint or a problem), and the
        problems found.
    """
    out = Findings()
    if not path or not looks_local(path):
        return None, out
    folder = os.path.expanduser(path)
    if not os.path.exists(folder):
        out.problems.append(f"{key}: {path} does not exist on this node")
        return None, out
    if not os.path.isdir(folder):
        return None, out  # a single-file checkpoint (GGUF) carries no config.json
    config_path = os.path.join(folder, "config.json")
    try:
        with open(config_path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        out.problems.append(
            f"{key}: {path} has no config.json; point it at the model's folder (the one "
            "that holds config.json)"
        )
        return None, out
    except OSError as exc:
        out.problems.append(f"{key}: cannot read {config_path} ({exc.strerror})")
        return None, out
    except ValueError as exc:
        out.problems.append(f"{key}: {config_path} is not valid JSON ({exc})")
        return None, out
    if not isinstance(data, dict):
        out.problems.append(f"{key}: {config_path} is not a JSON object")
        return None, out
    # SGLang reads a multimodal model's language part (hf_text_config), e.g. Kimi-K2.5's.
    text = data.get("text_config")
    text = text if isinstance(text, dict) else data
    layers = text.get("num_hidden_layers", data.get("num_hidden_layers"))
    archs = data.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    info = ModelInfo(
        path=path,
        config=data,
        architecture=arch,
        num_layers=layers if isinstance(layers, int) and layers > 0 else None,
        context_len=SGLANG.context_length(text),
    )
    return info, out


def _context_flag(extra_flags: Sequence[str]) -> int | None:
    for i, arg in enumerate(extra_flags):
        name, sep, value = arg.partition("=")
        if name != CONTEXT_LENGTH_FLAG:
            continue
        text = value if sep else (extra_flags[i + 1] if i + 1 < len(extra_flags) else "")
        return int(text) if text.isdigit() else None
    return None


def check_context_length(
    target: ModelInfo | None,
    draft: ModelInfo | None,
    *,
    extra_flags: Sequence[str],
    env: Mapping[str, str],
) -> Findings:
    """SGLang refuses a context longer than a model's config allows (model_config.py:1248-1272).

    The draft is built with the target's context length (eagle_worker_v2.py:229), so a
    drafter with a shorter ``max_position_embeddings`` stops every speculative start, unless
    ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN`` is true.
    """
    out = Findings()
    if SGLANG.longer_context_allowed(env):
        return out
    given = _context_flag(extra_flags)
    fix = f"or set server.env.{LONGER_CONTEXT_ENV}=1"
    if target is not None and given is not None and target.context_len is not None:
        if given > target.context_len:
            out.problems.append(
                f"server.extra_flags: --context-length {given} is longer than the target's "
                f"{target.context_len} (its config.json); SGLang refuses to start: lower it "
                f"{fix}"
            )
            return out
    length = given if given is not None else (target.context_len if target else None)
    if draft is None or draft.context_len is None or length is None:
        return out
    if length > draft.context_len:
        out.problems.append(
            f"server.draft_model_path: the drafter's context length ({draft.context_len}, its "
            f"config.json) is shorter than the target's ({length}); SGLang refuses every "
            f"speculative start: add --context-length {draft.context_len} to "
            f"server.extra_flags {fix}"
        )
    return out
