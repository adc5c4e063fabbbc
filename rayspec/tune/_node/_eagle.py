"""EAGLE-3: which target layers feed the drafter, against what the engine would pick."""

from __future__ import annotations

from rayspec.engines import SGLANG
from rayspec.engines import Engine
from rayspec.tune._node._findings import Findings
from rayspec.tune._node._models import ModelInfo

__all__ = ["check_aux_layers"]


def check_aux_layers(target: ModelInfo, draft: ModelInfo, engine: Engine = SGLANG) -> Findings:
    """The EAGLE-3 drafter's ``eagle_aux_hidden_state_layer_ids`` against the target.

    Refuses ids outside the target's layers; warns when they differ from the engine's default
    for the target's architecture, and when ids sit where the engine does not read them.
    """
    out = Findings()
    label = engine.label
    key = "server.draft_model_path"
    n_layers, arch = target.num_layers, target.architecture
    if n_layers is None:
        return out  # nothing to compare with
    eagle = draft.config.get("eagle_config")
    if isinstance(eagle, dict) and eagle.get("use_aux_hidden_state", True) is False:
        return out  # no aux capture at all
    default = engine.default_capture_ids(arch, n_layers)
    where = f"{arch or 'the target'} ({n_layers} layers)"
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") if isinstance(eagle, dict) else None
    if ids is None:
        # kimi_k25_eagle3.py:50-57 sizes the drafter from top-level ids, but the target
        # captures only what eagle_config says (spec_aux_hidden_state.py:188-196).
        loose = draft.config.get("eagle_aux_hidden_state_layer_ids")
        if isinstance(loose, list) and loose != default:
            out.warnings.append(
                f"{key}: config.json has eagle_aux_hidden_state_layer_ids {loose} outside "
                f"eagle_config, where {label} does not read them: the target feeds the "
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
            f"{key}: eagle_config.eagle_aux_hidden_state_layer_ids is {ids!r}; {label} needs "
            "a non-empty list of layer numbers"
        )
        return out
    top = engine.highest_layer_id(arch, n_layers)
    outside = [i for i in ids if not 0 <= i <= top]
    if outside:
        out.problems.append(
            f"{key}: eagle_aux_hidden_state_layer_ids {ids} name layers {outside} but the "
            f"target {target.path} has {n_layers} layers (0-{top}): this drafter was made for "
            "another model"
        )
        return out
    captured = engine.captured_layers(arch, ids, n_layers)
    if captured != engine.default_captured_layers(arch, n_layers):
        out.warnings.append(
            f"{key}: the drafter's eagle_aux_hidden_state_layer_ids are {ids}, {label}'s "
            f"default for {where} is {default}; a drafter fed other layers than it was "
            "trained on accepts far fewer tokens (speculation then looks like it does not "
            "pay): check which layers it was trained on"
        )
    return out
