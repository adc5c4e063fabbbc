"""EAGLE-3 in SGLang: which target layers feed the drafter, from the draft's layer ids.

Pure functions over an architecture name, the draft's ids and the target's layer count; the
node check (``tune/_node/_eagle.py``) compares a drafter against them.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["captured_layers", "default_capture_ids", "default_captured_layers", "keeps_last_layer"]

# EAGLE-3: which target layers feed the drafter
#
# SGLang 0.5.23 reads the ids from the draft's config.json, eagle_config.
# eagle_aux_hidden_state_layer_ids (model_runner_components/spec_aux_hidden_state.py:185-196),
# and hands them, or None, to the target's set_eagle3_layers_to_capture
# (attention_backend_setup.py:54-61, called from model_runner.py:1112). The target captures
# the residual stream *entering* layer k for each k in layers_to_capture
# (deepseek_v2.py:3175-3195, llama.py:486-493), so an id i (the output of layer i) becomes
# k = i + 1. With no ids the default is k = [2, L // 2, L - 3] (llama.py:929-941 and most
# models). Exceptions below.

# DeepSeek-V2 and its subclasses shift the ids only when the first is 1, else use them as
# given (deepseek_v2.py:3458-3473, glm4_moe_lite.py:805-820); Kimi-K2.5 delegates to its
# DeepseekV3 language model (kimi_k25.py:693, :928-939).
_SHIFT_IF_FIRST_IS_ONE = frozenset(
    {
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM",
        "GlmMoeDsaForCausalLM",
        "Glm4MoeLiteForCausalLM",
        "MistralLarge3ForCausalLM",
        "KimiK25ForConditionalGeneration",
    }
)
# gpt-oss keeps ids whose largest is L (its final state), else shifts (gpt_oss.py:1337-1351).
_KEEP_IF_MAX_IS_L = frozenset({"GptOssForCausalLM"})
# MiniMax-M3-VL shifts its default too (minimax_m3_vl.py:246-261).
_SHIFT_DEFAULT = frozenset({"MiniMaxM3SparseForConditionalGeneration"})


def captured_layers(arch: str | None, ids: Sequence[int], n_layers: int) -> list[int]:
    """The ``layers_to_capture`` the target builds from the draft's ids."""
    if arch in _SHIFT_IF_FIRST_IS_ONE and ids[0] != 1:
        return list(ids)
    if arch in _KEEP_IF_MAX_IS_L and max(ids) == n_layers:
        return list(ids)
    return [i + 1 for i in ids]


def default_captured_layers(arch: str | None, n_layers: int) -> list[int]:
    """The ``layers_to_capture`` the target builds when the draft names no ids."""
    ks = [2, n_layers // 2, n_layers - 3]
    return [k + 1 for k in ks] if arch in _SHIFT_DEFAULT else ks


def default_capture_ids(arch: str | None, n_layers: int) -> list[int]:
    """The draft ids that make SGLang capture what it captures by default for ``arch``."""
    return [k - 1 for k in default_captured_layers(arch, n_layers)]


def keeps_last_layer(arch: str | None) -> bool:
    """Whether an id may name the target's last layer count itself (its final state)."""
    return arch in _KEEP_IF_MAX_IS_L
