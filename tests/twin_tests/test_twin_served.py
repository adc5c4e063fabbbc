"""What the twin serves (issue 33, a newcomer's find and item 13): a local model folder is read
as SGLang reads it (its context length, its model type), and a model or TP size the profile
does not describe is said in one line each, in the log and in /server_info; the timings stay
the profile's."""

from __future__ import annotations

import json
from typing import Any

import httpx

from rayspec.twin import load_profile
from rayspec.twin._served import mismatches
from rayspec.twin._served import read_model_folder

from .conftest import StartTwin

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
         "num_hidden_layers": 8, "max_position_embeddings": 2048}  # fmt: skip


def _folder(tmp_path: Any, config: dict[str, Any]) -> str:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_a_model_and_tp_the_profile_does_not_describe_are_said(
    start_twin: StartTwin, tmp_path: Any
) -> None:
    path = _folder(tmp_path, LLAMA)
    twin = start_twin(["--model-path", path, "--tp-size", "4", "--twin-realtime", "false"])
    c = httpx.Client(base_url=twin.base_url, timeout=30)
    lines = [ln for ln in twin.log().splitlines() if "rayspec twin: " in ln]
    assert "profile kimi-k2.5-tp8-pcie: KimiK25ForConditionalGeneration" in lines[0]
    said = lines[1:3]
    assert "--tp-size 4: profile kimi-k2.5-tp8-pcie" in said[0]
    assert "the timings are TP 8's, not TP 4's" in said[0]
    assert f"--model-path {path}: a LlamaForCausalLM (128 hidden, 8 layers)" in said[1]
    info = c.get("/server_info").json()["rayspec_twin"]
    assert (
        info["simulates"].startswith("profile kimi-k2.5-tp8-pcie") and len(info["mismatches"]) == 2
    )
    # SGLang's reading of the folder: its context length and model type.
    assert c.get("/v1/models").json()["data"][0]["max_model_len"] == 2048
    assert c.get("/model_info").json()["model_type"] == "llama"


def test_the_profiles_own_model_is_quiet(tmp_path: Any) -> None:
    profile = load_profile("kimi-k2.5-tp8-pcie")
    model = profile.model
    kimi = {"architectures": [model.architecture], "text_config": {
        "hidden_size": model.hidden, "num_hidden_layers": model.layers,
        "max_position_embeddings": 262144}}  # fmt: skip
    folder = read_model_folder(_folder(tmp_path, kimi))
    assert folder is not None and folder.context_len == 262144
    assert mismatches(profile, str(tmp_path), 8, folder) == []
    assert mismatches(profile, "rayspec-twin/kimi-k2.5-tp8-pcie", 8) == []  # a study's default
    assert len(mismatches(profile, "moonshotai/Kimi-K2.5", 8)) == 1  # not read: said
