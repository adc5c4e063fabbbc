"""The tiny models: what rayspec's preflight reads of them, and that they are made the same way
every time (the cache key is the recipe)."""

from __future__ import annotations

import json
from pathlib import Path

from rayspec.tune._node._eagle import check_aux_layers
from rayspec.tune._node._models import read_model
from tests.real_sglang._models import TinyModels
from tests.real_sglang._models import recipe_key
from tests.real_sglang._models import tiny_models as make_tiny_models


def test_preflight_reads_both_models_and_finds_nothing_to_say(tiny_models: TinyModels) -> None:
    """The drafter's aux layer ids are SGLang's default for the 8-layer target: no warning."""
    target, found_t = read_model("server.model_path", str(tiny_models.target))
    draft, found_d = read_model("server.draft_model_path", str(tiny_models.draft))
    assert target is not None and draft is not None
    assert not (found_t.problems or found_d.problems)
    assert target.architecture == "LlamaForCausalLM" and target.num_layers == 8
    assert draft.architecture == "LlamaForCausalLMEagle3" and draft.num_layers == 1
    findings = check_aux_layers(target, draft)
    assert findings.problems == [] and findings.warnings == []


def test_the_agreeing_pair_differs_from_the_random_pair_only_in_weights(
    tiny_models: TinyModels,
) -> None:
    for random_model, agreeing in (
        (tiny_models.target, tiny_models.agree_target),
        (tiny_models.draft, tiny_models.agree_draft),
    ):
        config = json.loads((random_model / "config.json").read_text())
        assert json.loads((agreeing / "config.json").read_text()) == config
        weights = (random_model / "model.safetensors").read_bytes()
        assert (agreeing / "model.safetensors").read_bytes() != weights


def test_a_fresh_build_is_byte_identical_to_the_cached_one(
    sglang_python: Path, tiny_models: TinyModels, tmp_path: Path
) -> None:
    fresh = make_tiny_models(sglang_python, cache=tmp_path)
    for name in ("target", "draft", "agree_target", "agree_draft"):
        cached, built = getattr(tiny_models, name), getattr(fresh, name)
        for path in sorted(cached.iterdir()):
            assert (built / path.name).read_bytes() == path.read_bytes(), (name, path.name)
    assert fresh.target.parent.name == recipe_key()
