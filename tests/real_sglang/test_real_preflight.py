"""Preflight against the real install: SGLang's version asked of the server's interpreter, the
tiny models' ``config.json``, and the EAGLE-3 layer-id check, whose model of SGLang is checked
against SGLang's own code. No server is started."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import pytest

from rayspec._config import load_config
from rayspec._exceptions import ConfigError
from rayspec.engines.sglang._eagle import captured_layers as _captured
from rayspec.engines.sglang._eagle import default_captured_layers as _default_captured
from rayspec.tune._node import InstalledSGLang
from rayspec.tune._node import NodeProbes
from rayspec.tune._node import check_aux_layers
from rayspec.tune._node import check_sglang
from rayspec.tune._node import default_probes
from rayspec.tune._node import probe_sglang
from rayspec.tune._node import read_model
from rayspec.tune._preflight import preflight
from tests.helpers import free_port_block
from tests.real_sglang import _study as st
from tests.real_sglang._models import TinyModels
from tests.real_sglang._server import scaffold_env


@pytest.fixture(scope="module")
def probes() -> NodeProbes:
    """The real probes, SGLang's import asked once per interpreter (each costs 10-30 s here)."""
    real = default_probes()
    seen: dict[str, InstalledSGLang] = {}

    def sglang(python: str, env: Mapping[str, str]) -> InstalledSGLang:
        if python not in seen:
            seen[python] = real.sglang(python, env)
        return seen[python]

    return NodeProbes(sglang=sglang, nvml=real.nvml)


def _config(tmp_path: Path, python: Path, models: TinyModels, draft: Path | None = None):
    doc = st.experiment(
        name="preflight", out_dir=tmp_path / "runs", python=python, target=models.target,
        draft=draft or models.draft, port=free_port_block(), env=scaffold_env(), enqueue=[],
        max_restarts=1, num_steps=[2], eagle_topk=[1], num_draft_tokens=[3],
    )  # fmt: skip
    return load_config(str(st.write_yaml(tmp_path / "exp.yaml", doc)), [])


def _draft_with_ids(tmp_path: Path, models: TinyModels, ids: list[int]) -> Path:
    draft = tmp_path / f"draft-{'-'.join(map(str, ids))}"
    shutil.copytree(models.draft, draft)
    config = json.loads((draft / "config.json").read_text())
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = ids
    (draft / "config.json").write_text(json.dumps(config))
    return draft


def test_the_version_comes_from_the_servers_interpreter(sglang_python: Path) -> None:
    found = probe_sglang(str(sglang_python), scaffold_env())
    assert found.version == "0.5.23", found
    assert check_sglang(found, python=str(sglang_python), configured="0.5.23").problems == []
    wrong = check_sglang(found, python=str(sglang_python), configured="0.5.22")
    assert any("set server.sglang_version=0.5.23" in p for p in wrong.problems), wrong.problems


def test_the_tiny_models_pass_preflight(
    sglang_python: Path, tiny_models: TinyModels, tmp_path: Path, probes: NodeProbes
) -> None:
    warnings = preflight(_config(tmp_path, sglang_python, tiny_models), probes=probes)
    assert not [w for w in warnings if "eagle_aux" in w or "draft" in w], warnings
    target, found = read_model("server.model_path", str(tiny_models.target))
    assert target is not None and not found.problems
    assert (target.architecture, target.num_layers) == ("LlamaForCausalLM", 8)
    draft, found = read_model("server.draft_model_path", str(tiny_models.draft))
    assert draft is not None and not found.problems
    assert check_aux_layers(target, draft).problems == []
    assert check_aux_layers(target, draft).warnings == []


def test_a_drafter_for_another_model_is_refused(
    sglang_python: Path, tiny_models: TinyModels, tmp_path: Path, probes: NodeProbes
) -> None:
    draft = _draft_with_ids(tmp_path, tiny_models, [1, 3, 8])  # the target has layers 0-7
    with pytest.raises(ConfigError, match=r"layers \[8\] but the target .* has 8 layers"):
        preflight(_config(tmp_path, sglang_python, tiny_models, draft), probes=probes)


def test_other_layers_than_sglangs_default_warn(
    sglang_python: Path, tiny_models: TinyModels, tmp_path: Path, probes: NodeProbes
) -> None:
    draft = _draft_with_ids(tmp_path, tiny_models, [0, 3, 4])
    warnings = preflight(_config(tmp_path, sglang_python, tiny_models, draft), probes=probes)
    assert any("[0, 3, 4]" in w and "[1, 3, 4]" in w for w in warnings), warnings


_ASK_SGLANG = """
import json, sys, types
from sglang.srt.models.llama import LlamaForCausalLM
n = int(sys.argv[1])
out = {}
for key, ids in (("default", None), ("given", json.loads(sys.argv[2]))):
    model = types.SimpleNamespace(
        pp_group=types.SimpleNamespace(is_last_rank=True),
        config=types.SimpleNamespace(num_hidden_layers=n),
        model=types.SimpleNamespace(layers_to_capture=None),
    )
    LlamaForCausalLM.set_eagle3_layers_to_capture(model, ids)
    out[key] = model.model.layers_to_capture
print(json.dumps(out))
"""


def test_the_layer_check_captures_what_sglang_captures(
    sglang_python: Path, tiny_models: TinyModels
) -> None:
    target, _ = read_model("server.model_path", str(tiny_models.target))
    draft, _ = read_model("server.draft_model_path", str(tiny_models.draft))
    assert target is not None and draft is not None and target.num_layers is not None
    ids = draft.config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    env = {k: v for k, v in scaffold_env().items() if k != "RAYSPEC_TEST_FAKE_AMX"}
    proc = subprocess.run(
        [str(sglang_python), "-c", _ASK_SGLANG, str(target.num_layers), json.dumps(ids)],
        capture_output=True, text=True, timeout=300, env={**st.driver_env(), **env},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    real = json.loads(proc.stdout.strip().splitlines()[-1])
    arch, n = target.architecture, target.num_layers
    assert real["given"] == _captured(arch, ids, n)
    assert real["default"] == _default_captured(arch, n)
