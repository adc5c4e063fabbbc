"""Preflight of a real node, with fake model folders, a fake NVML and a fake version probe.

Each problem is one line that names its key; warnings never refuse the study. Nothing here
imports SGLang or touches a GPU.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any

import pytest

from rayspec._config import load_config
from rayspec._exceptions import ConfigError
from rayspec.tune import _node
from rayspec.tune.__main__ import main
from rayspec.tune._node import GpuState
from rayspec.tune._node import InstalledSGLang
from rayspec.tune._node import NodeProbes
from rayspec.tune._node import check_gpus
from rayspec.tune._node import check_node
from rayspec.tune._node import default_capture_ids
from rayspec.tune._node import read_gpus
from rayspec.tune._node import visible_gpus
from rayspec.tune._preflight import preflight
from tests.helpers import free_port_block
from tests.helpers import twin_doc
from tests.helpers import write_experiment

GiB = 1024**3
KIMI_LAYERS = 61  # Kimi-K2.5's language model (DeepseekV3), under text_config
KIMI_IDS = [1, 29, 57]  # SGLang's default for it, as a drafter writes them


# -- fakes ------------------------------------------------------------------------------------


class FakeNvml:
    """The few NVML functions preflight calls, over a list of (used GiB, [(pid, name, GiB)])."""

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: list[tuple[float, list[tuple[int, str, float]]]] | None = None,
                 *, total_gib: float = 140.0, broken: bool = False) -> None:  # fmt: skip
        self.gpus = gpus if gpus is not None else [(0.5, [])] * 8
        self.total = int(total_gib * GiB)
        self.broken = broken
        self.calls: list[str] = []

    def nvmlInit(self) -> None:
        if self.broken:
            raise self.NVMLError("Driver Not Loaded")
        self.calls.append("init")

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return f"GPU-{handle:04d}-aaaa".encode()  # old pynvml answers bytes

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(used=int(self.gpus[handle][0] * GiB), total=self.total)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        return [SimpleNamespace(pid=pid, usedGpuMemory=int(gib * GiB))
                for pid, _name, gib in self.gpus[handle][1]]  # fmt: skip

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        for _used, procs in self.gpus:
            for p, name, _gib in procs:
                if p == pid:
                    return name
        raise self.NVMLError("Not Found")


def probes(version: str | None = "0.5.23", nvml: FakeNvml | None = None, *,
           nvml_installed: bool = True, error: str = "") -> NodeProbes:  # fmt: skip
    fake = nvml or FakeNvml()
    found = InstalledSGLang(version, missing=version is None and not error, error=error)
    return NodeProbes(
        sglang=lambda python, env: found, nvml=lambda: fake if nvml_installed else None
    )


def write_model(folder: Any, config: dict[str, Any] | str | None) -> str:
    os.makedirs(folder, exist_ok=True)
    if config is not None:
        text = config if isinstance(config, str) else json.dumps(config)
        (folder / "config.json").write_text(text)
    return str(folder)


def kimi(layers: int = KIMI_LAYERS, context: int = 262144) -> dict[str, Any]:
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "text_config": {
            "architectures": ["DeepseekV3ForCausalLM"],
            "num_hidden_layers": layers,
            "hidden_size": 7168,
            "max_position_embeddings": context,
            "rope_scaling": {"type": "yarn", "factor": 64.0,
                             "original_max_position_embeddings": 4096},
        },
    }  # fmt: skip


def drafter(ids: Any = KIMI_IDS, context: int = 262144, **extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "num_hidden_layers": 1,
        "max_position_embeddings": context,
        **extra,
    }
    if ids is not None:
        doc["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids}
    return doc


def field_cfg(tmp_path: Any, *overrides: str, target: Any = None, draft: Any = None,
              **server: Any) -> Any:  # fmt: skip
    """An sglang experiment on local model folders (Kimi-K2.5 and an EAGLE-3 drafter)."""
    model = write_model(tmp_path / "kimi", kimi() if target is None else target)
    draft_path = write_model(tmp_path / "eagle3", drafter() if draft is None else draft)
    srv = {"engine": "sglang", "model_path": model, "draft_model_path": draft_path,
           "port": free_port_block(1), **server}  # fmt: skip
    doc = twin_doc(str(tmp_path / "runs"), server=srv)
    # The dashboard's fixed port (8265) may be held by another test's study: not this test's.
    doc.setdefault("cluster", {})["include_dashboard"] = False
    return load_config(write_experiment(str(tmp_path), doc), list(overrides))


def only_problem(findings: Any, key: str, *needles: str) -> str:
    assert len(findings.problems) == 1, findings.problems
    line = findings.problems[0]
    assert line.startswith(f"{key}: ") and "\n" not in line, line
    for needle in needles:
        assert needle in line, line
    return line


# -- the good case ------------------------------------------------------------------------------


def test_a_good_node_passes_without_a_word(tmp_path) -> None:
    cfg = field_cfg(tmp_path)
    found = check_node(cfg, probes(), environ={})
    assert found.problems == [] and found.warnings == []
    assert preflight(cfg, probes=probes()) == []


# -- SGLang ---------------------------------------------------------------------------------------


def test_sglang_not_installed(tmp_path) -> None:
    found = check_node(field_cfg(tmp_path), probes(version=None), environ={})
    only_problem(found, "server.engine", "sglang is not installed", "server.python")


def test_server_python_that_cannot_import_sglang(tmp_path) -> None:
    cfg = field_cfg(tmp_path, python="/opt/sg/bin/python")
    err = "import sglang fails: ImportError: libcudnn.so.9: cannot open shared object file"
    found = check_node(cfg, probes(version=None, error=err), environ={})
    only_problem(found, "server.python", "/opt/sg/bin/python cannot import sglang", "libcudnn")


def test_the_server_interpreter_is_the_one_asked(tmp_path) -> None:
    asked: list[str] = []
    fakes = probes()
    spy = NodeProbes(sglang=lambda py, env: asked.append(py) or fakes.sglang(py, env),
                     nvml=fakes.nvml)  # fmt: skip
    check_node(field_cfg(tmp_path, python="/opt/sg/bin/python"), spy, environ={})
    assert asked == ["/opt/sg/bin/python"]


def test_a_version_mismatch_says_which_value_to_set(tmp_path) -> None:
    found = check_node(field_cfg(tmp_path), probes(version="0.5.12.post1"), environ={})
    only_problem(found, "server.sglang_version", "0.5.23 but", "SGLang 0.5.12.post1",
                 "--cuda-graph-max-bs,", "set server.sglang_version=0.5.12")  # fmt: skip


def test_a_version_older_than_the_table_is_refused(tmp_path) -> None:
    found = check_node(field_cfg(tmp_path), probes(version="0.3.6"), environ={})
    only_problem(found, "server.engine", "older than any version rayspec knows", "0.4.10")


def test_a_version_newer_than_the_table_only_warns(tmp_path) -> None:
    cfg = field_cfg(tmp_path, sglang_version="0.6.1")
    found = check_node(cfg, probes(version="0.6.1"), environ={})
    assert found.problems == []
    assert len(found.warnings) == 1 and "newer than any version" in found.warnings[0]


def test_the_real_probe_answers_missing_for_this_interpreter() -> None:
    import importlib.util
    import sys

    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("sglang is installed here")
    assert _node.probe_sglang(sys.executable) == InstalledSGLang(None, missing=True)
    assert "cannot run it" in _node.probe_sglang("/no/such/python").error


# -- model folders ----------------------------------------------------------------------------


def test_a_missing_model_folder(tmp_path) -> None:
    cfg = field_cfg(tmp_path, model_path=str(tmp_path / "nowhere"))
    only_problem(check_node(cfg, probes(), environ={}), "server.model_path", "does not exist")


def test_a_folder_without_config_json(tmp_path) -> None:
    empty = write_model(tmp_path / "empty", None)
    cfg = field_cfg(tmp_path, draft_model_path=empty)
    only_problem(check_node(cfg, probes(), environ={}), "server.draft_model_path",
                 "has no config.json")  # fmt: skip


def test_an_unreadable_config_json(tmp_path) -> None:
    cfg = field_cfg(tmp_path, draft="{not json")
    only_problem(check_node(cfg, probes(), environ={}), "server.draft_model_path",
                 "is not valid JSON")  # fmt: skip


def test_hub_ids_are_not_checked(tmp_path) -> None:
    cfg = field_cfg(tmp_path, model_path="moonshotai/Kimi-K2.5", draft_model_path="org/eagle3")
    assert check_node(cfg, probes(), environ={}).problems == []


# -- EAGLE-3 aux hidden-state layers ----------------------------------------------------------


def test_aux_layer_ids_beyond_the_target_are_refused(tmp_path) -> None:
    cfg = field_cfg(tmp_path, draft=drafter([2, 44, 86]))  # ids of a deeper model
    line = only_problem(check_node(cfg, probes(), environ={}), "server.draft_model_path",
                        "[2, 44, 86]", "layers [86]", "has 61 layers")  # fmt: skip
    assert "another model" in line


def test_aux_layer_ids_must_be_numbers(tmp_path) -> None:
    cfg = field_cfg(tmp_path, draft=drafter([]))
    only_problem(check_node(cfg, probes(), environ={}), "server.draft_model_path",
                 "non-empty list")  # fmt: skip


def test_aux_layer_ids_off_the_default_warn_with_both_lists(tmp_path) -> None:
    cfg = field_cfg(tmp_path, draft=drafter([3, 31, 59]))
    found = check_node(cfg, probes(), environ={})
    assert found.problems == []
    assert len(found.warnings) == 1
    warning = found.warnings[0]
    assert warning.startswith("server.draft_model_path: ")
    assert "[3, 31, 59]" in warning and "[1, 29, 57]" in warning
    assert "KimiK25ForConditionalGeneration (61 layers)" in warning
    # and it does not stop the study
    assert preflight(cfg, probes=probes()) == [warning]


def test_deepseek_targets_take_unshifted_ids_as_given(tmp_path) -> None:
    """DeepseekV2 (so Kimi-K2.5) shifts ids only when the first is 1: [2, 30, 58] captures
    what the default captures, so no warning."""
    cfg = field_cfg(tmp_path, draft=drafter([2, 30, 58]))
    assert check_node(cfg, probes(), environ={}).warnings == []


@pytest.mark.parametrize(
    ("arch", "layers", "expected"),
    [
        ("LlamaForCausalLM", 32, [1, 15, 28]),
        ("KimiK25ForConditionalGeneration", 61, KIMI_IDS),
        ("Qwen3MoeForCausalLM", 94, [1, 46, 90]),
        ("MiniMaxM3SparseForConditionalGeneration", 62, [2, 31, 59]),
    ],
)
def test_default_ids_per_architecture(arch: str, layers: int, expected: list[int]) -> None:
    assert default_capture_ids(arch, layers) == expected


def test_a_llama_target_with_other_ids_warns(tmp_path) -> None:
    llama = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32,
             "max_position_embeddings": 131072}  # fmt: skip
    ok = field_cfg(tmp_path / "a", target=llama, draft=drafter([1, 15, 28], context=131072))
    assert check_node(ok, probes(), environ={}).warnings == []
    off = field_cfg(tmp_path / "b", target=llama, draft=drafter([2, 16, 29], context=131072))
    (warning,) = check_node(off, probes(), environ={}).warnings
    assert "[2, 16, 29]" in warning and "[1, 15, 28]" in warning


def test_ids_outside_eagle_config_are_not_read_by_sglang(tmp_path) -> None:
    draft = drafter(None, eagle_aux_hidden_state_layer_ids=[3, 31, 59])
    found = check_node(field_cfg(tmp_path, draft=draft), probes(), environ={})
    assert found.problems == []
    (warning,) = found.warnings
    assert "outside eagle_config" in warning and "[1, 29, 57]" in warning


def test_ids_are_not_checked_without_eagle3(tmp_path) -> None:
    cfg = field_cfg(tmp_path, "search.speculative.modes=[off,EAGLE]",
                    draft=drafter([2, 44, 86]))  # fmt: skip
    assert check_node(cfg, probes(), environ={}).problems == []


# -- context length -------------------------------------------------------------------------------


def test_a_drafter_with_a_shorter_context_is_refused(tmp_path) -> None:
    cfg = field_cfg(tmp_path, draft=drafter(context=131072))
    only_problem(check_node(cfg, probes(), environ={}), "server.draft_model_path",
                 "(131072, its config.json)", "(262144)", "--context-length 131072",
                 "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN")  # fmt: skip


@pytest.mark.parametrize(
    "fix",
    [
        {"extra_flags": ["--context-length", "131072"]},
        {"env": {"SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1"}},
    ],
)
def test_a_shorter_drafter_passes_with_either_fix(tmp_path, fix: dict[str, Any]) -> None:
    cfg = field_cfg(tmp_path, draft=drafter(context=131072), **fix)
    assert check_node(cfg, probes(), environ={}).problems == []


# -- GPUs -----------------------------------------------------------------------------------------


def test_too_few_gpus(tmp_path) -> None:
    found = check_node(field_cfg(tmp_path), probes(nvml=FakeNvml([(0.5, [])] * 4)), environ={})
    only_problem(found, "server.tp_size", "needs 8 GPUs", "shows 4")


def test_a_busy_gpu_names_its_processes(tmp_path) -> None:
    gpus = [(0.5, [])] * 8
    gpus[3] = (61.5, [(4242, "/usr/bin/python3", 61.0), (77, "ghost", 0.4)])
    nvml = FakeNvml(gpus)
    found = check_node(field_cfg(tmp_path), probes(nvml=nvml), environ={})
    only_problem(found, "CUDA_VISIBLE_DEVICES", "GPU 3 already has 61.5 GiB of 140.0 GiB",
                 "pid 4242 python3 61.0 GiB", "pid 77 ghost")  # fmt: skip
    assert nvml.calls == ["init", "shutdown"]


def test_cuda_visible_devices_is_respected(tmp_path) -> None:
    gpus = [(70.0, [(1, "other", 70.0)])] * 4 + [(0.5, [])] * 4
    cfg = field_cfg(tmp_path, tp_size=4)
    fake = probes(nvml=FakeNvml(gpus))
    assert check_node(cfg, fake, environ={"CUDA_VISIBLE_DEVICES": "4,5,6,7"}).problems == []
    by_uuid = {"CUDA_VISIBLE_DEVICES": "GPU-0004,GPU-0005,GPU-0006,GPU-0007"}
    assert check_node(cfg, fake, environ=by_uuid).problems == []
    only_problem(check_node(cfg, fake, environ={"CUDA_VISIBLE_DEVICES": "3,4,5,6"}),
                 "CUDA_VISIBLE_DEVICES", "GPU 3 ", "now '3,4,5,6'")  # fmt: skip


def test_visible_gpus_stop_at_the_first_bad_entry() -> None:
    gpus = [GpuState(i, f"GPU-{i}", 0, 80 * GiB) for i in range(4)]
    assert [g.index for g in visible_gpus(gpus, "2,0,9,1")[0]] == [2, 0]
    assert visible_gpus(gpus, "")[0] == []
    assert visible_gpus(gpus, "MIG-1234")[1].startswith("GPU checks skipped")


def test_cluster_num_gpus_beyond_the_node(tmp_path) -> None:
    cfg = field_cfg(tmp_path, "cluster.num_gpus=16")
    only_problem(check_node(cfg, probes(), environ={}), "cluster.num_gpus", "16", "shows 8")


def test_the_busy_threshold_is_the_smaller_of_2_gib_and_10_percent() -> None:
    small = GpuState(0, "GPU-0", int(1.7 * GiB), 16 * GiB)  # 10 % of 16 GiB is 1.6 GiB
    big = GpuState(1, "GPU-1", int(1.9 * GiB), 140 * GiB)
    assert len(check_gpus([small], tp_size=1, num_gpus=None, cuda_visible=None).problems) == 1
    assert check_gpus([big], tp_size=1, num_gpus=None, cuda_visible=None).problems == []


def test_without_pynvml_the_gpu_checks_are_skipped_with_one_line(tmp_path) -> None:
    found = check_node(field_cfg(tmp_path), probes(nvml_installed=False), environ={})
    assert found.problems == []
    assert found.warnings == [
        "GPU checks skipped: pynvml is not installed (pip install 'rayspec[gpu]')"
    ]


def test_an_nvml_without_driver_skips_the_gpu_checks(tmp_path) -> None:
    found = check_node(field_cfg(tmp_path), probes(nvml=FakeNvml(broken=True)), environ={})
    assert found.problems == [] and "Driver Not Loaded" in found.warnings[0]


def test_read_gpus_decodes_old_pynvml_bytes() -> None:
    (gpu,) = read_gpus(FakeNvml([(1.0, [(9, "x", 1.0)])]))
    assert gpu.uuid == "GPU-0000-aaaa" and gpu.processes[0].name == "x"


# -- NCCL values ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "key", "needles"),
    [
        ("search.nccl={NCCL_PROTO: [LL, LL256]}", "search.nccl.NCCL_PROTO",
         ("'LL256'", "NCCL refuses it at communicator init", "every trial with it would fail")),
        ("search.nccl={NCCL_ALGO: ['allreduce:ring;broadcast:Rings']}", "search.nccl.NCCL_ALGO",
         ("Unrecognized element token \"Rings\"",)),
        ("search.nccl={NCCL_P2P_LEVEL: [sys, PHB]}", "search.nccl.NCCL_P2P_LEVEL",
         ("'sys'", "NCCL ignores it silently (case-sensitive): use SYS")),
        ("search.nccl={NCCL_P2P_LEVEL: [NVLINK]}", "search.nccl.NCCL_P2P_LEVEL",
         ("use one of LOC, NVL",)),
        ("search.nccl={NCCL_NTHREADS: ['512', 512k]}", "search.nccl.NCCL_NTHREADS",
         ("'512k' is not an integer",)),
        ("server.env={NCCL_BUFFSIZE: 16MB}", "server.env.NCCL_BUFFSIZE", ("'16MB'",)),
        ("server.env={NCCL_MAX_NCHANNELS: ''}", "server.env.NCCL_MAX_NCHANNELS", ("''",)),
    ],
)  # fmt: skip
def test_bad_nccl_values_are_refused(tmp_path, override: str, key: str, needles: tuple[str, ...]):
    cfg = field_cfg(tmp_path, override, model_path="org/kimi", draft_model_path="org/d")
    only_problem(_node.check_nccl_values(cfg), key, *needles)


def test_good_nccl_values_pass(tmp_path) -> None:
    cfg = field_cfg(
        tmp_path,
        "search.nccl={NCCL_PROTO: [LL, 'll,simple', '^LL128'], NCCL_ALGO: [Ring, tree],"
        " NCCL_P2P_LEVEL: [PHB, SYS, '3'], NCCL_BUFFSIZE: ['0x1000000'], NCCL_NTHREADS: ['512']}",
    )
    assert _node.check_nccl_values(cfg).problems == []


def test_the_twin_still_accepts_bad_nccl_values_on_purpose(tmp_path) -> None:
    doc = twin_doc(
        str(tmp_path / "runs"),
        search={"nccl": {"NCCL_PROTO": ["LL", "LL256"], "NCCL_P2P_LEVEL": ["sys"]}},
    )
    cfg = load_config(write_experiment(str(tmp_path), doc), [])
    assert preflight(cfg, launching=False) == []


def test_nccl_values_are_checked_in_a_dry_run_too(tmp_path, capsys) -> None:
    field_cfg(tmp_path)
    path = os.path.join(str(tmp_path), "exp.yaml")
    assert main([path, "search.nccl={NCCL_PROTO: [LL256]}", "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: search.nccl.NCCL_PROTO: 'LL256'") and "\n" not in err


# -- several problems, and the CLI ------------------------------------------------------------


def test_every_problem_is_reported_one_line_each(tmp_path) -> None:
    cfg = field_cfg(tmp_path, "search.nccl={NCCL_PROTO: [LL256]}",
                    model_path=str(tmp_path / "nowhere"), draft=drafter(context=4096))  # fmt: skip
    nvml = FakeNvml([(0.5, [])] * 7 + [(30.0, [(5, "python3", 29.5)])])
    with pytest.raises(ConfigError) as info:
        preflight(cfg, probes=probes(version="0.5.18", nvml=nvml))
    lines = str(info.value).splitlines()
    keys = [line.removeprefix("error: ").split(":")[0] for line in lines]
    assert keys == ["search.nccl.NCCL_PROTO", "server.sglang_version", "server.model_path",
                    "CUDA_VISIBLE_DEVICES"], lines  # fmt: skip
    assert all(line.startswith("error: ") for line in lines[1:])


def _patch_probes(monkeypatch, fakes: NodeProbes) -> list[object]:
    import ray

    started: list[object] = []
    monkeypatch.setattr(ray, "init", lambda *a, **k: started.append((a, k)))
    # default_probes() builds the real probes from these names in its own module.
    monkeypatch.setattr(_node._check, "probe_sglang", fakes.sglang)
    monkeypatch.setattr(_node._check, "load_nvml", fakes.nvml)
    return started


def test_cli_refuses_a_bad_node_with_one_line_and_starts_nothing(tmp_path, monkeypatch,
                                                                 capsys) -> None:  # fmt: skip
    started = _patch_probes(monkeypatch, probes(version="0.5.12"))
    cfg = field_cfg(tmp_path)
    rc = main([os.path.join(str(tmp_path), "exp.yaml")])
    err = capsys.readouterr().err
    assert rc == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: server.sglang_version: 0.5.23 but")
    assert "set server.sglang_version=0.5.12" in lines[0]
    assert not os.path.exists(cfg.out_dir)  # nothing written
    assert started == []  # Ray was never started


def test_cli_prints_warnings_and_goes_on(tmp_path, monkeypatch, capsys) -> None:
    import rayspec.tune.__main__ as cli

    _patch_probes(monkeypatch, probes(nvml_installed=False))
    ran: list[object] = []
    monkeypatch.setattr(cli, "_run", lambda cfg, *_: ran.append(cfg) or 0)
    field_cfg(tmp_path, draft=drafter([3, 31, 59]))
    assert main([os.path.join(str(tmp_path), "exp.yaml")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(ran) == 1
    assert err[0].startswith("warning: server.draft_model_path: the drafter's")
    assert (
        err[1] == "warning: GPU checks skipped: pynvml is not installed "
        "(pip install 'rayspec[gpu]')"
    )
