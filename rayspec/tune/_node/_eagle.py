"""EAGLE-3: which target layers feed the drafter, against what SGLang would pick."""

from __future__ import annotations

from collections.abc import Sequence

from rayspec.tune._node._findings import Findings
from rayspec.tune._node._models import ModelInfo

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


def _captured(arch: str | None, ids: Sequence[int], n_layers: int) -> list[int]:
    """The ``layers_to_capture`` the target builds from the draft's ids."""
    if arch in _SHIFT_IF_FIRST_IS_ONE and ids[0] != 1:
        return list(ids)
    if arch in _KEEP_IF_MAX_IS_L and max(ids) == n_layers:
        return list(ids)
    return [i + 1 for i in ids]


def _default_captured(arch: str | None, n_layers: int) -> list[int]:
    ks = [2, n_layers // 2, n_layers - 3]
    return [k + 1 for k in ks] if arch in _SHIFT_DEFAULT else ks


def default_capture_ids(arch: str | None, n_layers: int) -> list[int]:
    """The draft ids that make SGLang capture what it captures by default for ``arch``."""
    return [k - 1 for k in _default_captured(arch, n_layers)]


def check_aux_layers(target: ModelInfo, draft: ModelInfo) -> Findings:
    """The EAGLE-3 drafter's ``eagle_aux_hidden_state_layer_ids`` against the target.

    Refuses ids outside the target's layers; warns when they differ from SGLang's default for
    the target's architecture, and when ids sit where SGLang does not read them.
    """
    out = Findings()
    key = "server.draft_model_path"
    n_layers, arch = target.num_layers, target.architecture
    if n_layers is None:
        return out  # nothing to compare with
    eagle = draft.config.get("eagle_config")
    if isinstance(eagle, dict) and eagle.get("use_aux_hidden_state", True) is False:
        return out  # no aux capture at all
    default = default_capture_ids(arch, n_layers)
    where = f"{arch or 'the target'} ({n_layers} layers)"
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    if ids is None:
        # kimi_k25_eagle3.py:50-57 sizes the drafter from top-level ids, but the target
        # captures only what eagle_config says (spec_aux_hidden_state.py:188-196).
        loose = draft.config.get("eagle_aux_hidden_state_layer_ids")
        if isinstance(loose, list) and loose != default:
            out.warnings.append(
                f"{key}: config.json has eagle_aux_hidden_state_layer_ids {loose} outside "
                f"eagle_config, where SGLang does not read them: the target feeds the "
                f"drafter its default layers {default} for {where}; move them into "
                "eagle_config if the drafter was trained on them"
            )
        return out
    if (
        not isinstance(ids, list)
        or not ids
        or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
    ):
        out.problems.append(
            f"{key}: eagle_config.eagle_aux_hidden_state_layer_ids is {ids!r}; SGLang needs a "
            "non-empty list of layer numbers"
        )
        return out
    top = n_layers if arch in _KEEP_IF_MAX_IS_L else n_layers - 1
    outside = [i for i in ids if not 0 <= i <= top]
    if outside:
        out.problems.append(
            f"{key}: eagle_aux_hidden_state_layer_ids {ids} name layers {outside} but the "
            f"target {target.path} has {n_layers} layers (0-{top}): this drafter was made for "
            "another model"
        )
        return out
    if _captured(arch, ids, n_layers) != _default_captured(arch, n_layers):
        out.warnings.append(
            f"{key}: the drafter's eagle_aux_hidden_state_layer_ids are {ids}, SGLang's "
            f"default for {where} is {default}; a drafter fed other layers than it was "
            "trained on accepts far fewer tokens (speculation then looks like it does not "
            "pay): check which layers it was trained on"
        )
    return out
