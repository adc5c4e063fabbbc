"""The context length SGLang derives from a model's config, and when it accepts a longer one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["CONTEXT_LENGTH_FLAG", "LONGER_CONTEXT_ENV", "context_length", "longer_context_allowed"]

#: The flag that sets the context length.
CONTEXT_LENGTH_FLAG = "--context-length"
#: True: SGLang accepts a context longer than the model's config gives (model_config.py).
LONGER_CONTEXT_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"

# The keys SGLang's get_context_length tries, in order (srt/utils/hf_transformers/common.py).
_CONTEXT_KEYS = (
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
)


def context_length(text: Mapping[str, Any]) -> int | None:
    """SGLang's ``get_context_length`` on a raw config; None when no key is there (then the
    config class's own default applies, which a raw read cannot know)."""
    factor: float = 1
    rope = text.get("rope_scaling")
    if isinstance(rope, dict) and rope:
        factor = rope.get("factor", 1) or 1
        if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
            factor = 1
    for name in _CONTEXT_KEYS:
        value = text.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(factor * value)
    return None


def longer_context_allowed(env: Mapping[str, str]) -> bool:
    """Whether the server's environment lets SGLang take a context past the config's."""
    return env.get(LONGER_CONTEXT_ENV, "").lower() in ("true", "1", "yes", "y")
