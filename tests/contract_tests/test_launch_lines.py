"""rayspec's SGLang launch lines, checked by the pinned SGLang's own parser and resolution.

For every experiment file and every kind of candidate, :func:`rayspec.server.build_launch`
builds the line; SGLang's ``prepare_server_args`` parses the flags after ``python -m
sglang.launch_server`` and ``ServerArgs.resolve_once()`` resolves them, and the effective
values must be what the line says (docs/sglang.md, *Launch template*, *Speculative rules*). All
lines go to SGLang in one
batch (its import takes seconds), so the module runs in well under a minute.

Resolution on a machine without a GPU needs ``--device``: without it SGLang raises
``RuntimeError: No accelerator ...``. The probe adds ``--device cuda``, as a GPU node would
detect; with ``--device cpu`` SGLang's CPU path clamps the decode CUDA-graph cap to 32
(``torch_compile_max_bs``), which is no statement about a GPU node (both shown below). With no
GPU visible, only defaults that depend on GPU memory take fallbacks, and rayspec pins all of
those (docs/sglang.md, *Speculative rules*).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from rayspec import Candidate
from rayspec import SpecSettings
from rayspec._config import ExperimentConfig
from rayspec._config import load_config
from rayspec._types import LaunchSpec
from rayspec.engines.sglang import cuda_graph_flag
from rayspec.engines.sglang import parse_sglang_version
from rayspec.engines.sglang import sglang_features
from rayspec.search import SearchSpace
from rayspec.server import build_launch
from rayspec.testing import FIELD_TUNED_NCCL
from tests.contract_tests._sglang import PINNED
from tests.contract_tests._sglang import FakeModels
from tests.contract_tests._sglang import ProbeCase
from tests.contract_tests._sglang import ProbeRunner

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted((ROOT / "experiments").glob("*.yaml"))
DEVICE = ("--device", "cuda")
PORT = 31000
TUNED_NCCL = tuple(sorted(FIELD_TUNED_NCCL.items()))
# The search choices the space-built candidates ask for (the experiment's own lists may
# change; what is checked here is what rayspec makes of such a choice).
SPACE_OVERRIDES = [
    "search.speculative.modes=[off,EAGLE3,EAGLE3-adaptive]",
    "search.speculative.overlap=[on,off]",
    "search.speculative.num_steps=[2]",
    "search.speculative.eagle_topk=[1,4]",
    "search.speculative.num_draft_tokens=[3,6,8]",
    "search.flags={--disable-custom-all-reduce: [on, off]}",
    "search.scheduler.max_running_requests=[16,96]",
    "search.scheduler.cuda_graph_max_bs=[8,16]",
    "search.scheduler.chunked_prefill_size=[-1,2048]",
]
CHAIN = {"spec.mode": "EAGLE3", "spec.num_steps": 2, "spec.eagle_topk": 1}


def _space_candidate(cfg: ExperimentConfig, params: dict[str, Any]) -> Candidate:
    return SearchSpace.from_config(cfg.search).candidate(params)


# Each kind of candidate: (how it is made, given the config with SPACE_OVERRIDES; extra
# overrides of the config the line is built from).
KINDS: dict[str, tuple[Callable[[ExperimentConfig], Candidate], list[str]]] = {
    "baseline": (lambda cfg: Candidate(), []),
    "chain": (
        lambda cfg: Candidate(nccl_env=TUNED_NCCL, spec=SpecSettings("EAGLE3", 2, 1, 3)),
        [],
    ),
    "tree": (lambda cfg: Candidate(spec=SpecSettings("EAGLE3", 2, 4, 6)), []),
    # The config asks topk 1 with 8 draft tokens; rayspec passes steps + 1 itself.
    "chain-asks-ndt8": (
        lambda cfg: _space_candidate(cfg, {**CHAIN, "spec.num_draft_tokens": 8}),
        [],
    ),
    "searched-flag": (
        lambda cfg: _space_candidate(cfg, {"flags.--disable-custom-all-reduce": "on"}),
        [],
    ),
    # SGLang's adaptive steps: topk 1, starting at 3 (in its candidate steps [0, 1, 3, 5, 7]).
    "adaptive": (lambda cfg: _space_candidate(cfg, {"spec.mode": "EAGLE3-adaptive"}), []),
    # The speculative overlap scheduler off (0.5.23: --disable-overlap-schedule).
    "chain-overlap-off": (lambda cfg: _space_candidate(cfg, {**CHAIN, "spec.overlap": "off"}), []),
    # Searched scheduler knobs (search.scheduler) replace server.*: a small graph cap under a
    # large running cap, chunking off; and a searched running cap the graph cap follows.
    "searched-knobs": (
        lambda cfg: _space_candidate(
            cfg,
            {
                **CHAIN,
                "sched.max_running_requests": 96,
                "sched.cuda_graph_max_bs": 8,
                "sched.chunked_prefill_size": -1,
            },
        ),
        [],
    ),  # fmt: skip
    "searched-running-cap": (
        lambda cfg: _space_candidate(
            cfg, {"sched.max_running_requests": 16, "sched.chunked_prefill_size": 2048}
        ),
        ["server.cuda_graph_max_bs=null"],
    ),
    # rayspec's own caps, not SGLang's 48: the graph cap follows max_running_requests.
    "chain-own-caps": (
        lambda cfg: Candidate(spec=SpecSettings("EAGLE3", 3, 1, 4)),
        ["server.max_running_requests=64", "server.cuda_graph_max_bs=null"],
    ),
}
LINE_CASES = [f"{exp.stem}-{kind}" for exp in EXPERIMENTS for kind in KINDS]


@dataclasses.dataclass(frozen=True)
class Line:
    """One launch line rayspec built, and the config it came from."""

    cfg: ExperimentConfig
    candidate: Candidate
    launch: LaunchSpec

    @property
    def argv(self) -> tuple[str, ...]:
        return self.launch.argv

    def probe_case(self, name: str) -> ProbeCase:
        """The flags after ``python -m sglang.launch_server``, with the line's environment."""
        return ProbeCase(
            id=name,
            argv=(*self.argv[3:], *DEVICE),
            env=self.launch.env_dict,
            unset_env=self.launch.unset_env,
        )


def _overrides(models: FakeModels) -> list[str]:
    return [
        "server.engine=sglang",
        f"server.model_path={models.target}",
        f"server.draft_model_path={models.draft}",
    ]


def _value(argv: Sequence[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def line_says(argv: Sequence[str], graph_flag: str) -> dict[str, Any]:
    """The effective values a launch line asks for, read from the line itself."""
    says: dict[str, Any] = {
        "model_path": _value(argv, "--model-path"),
        "tp_size": int(_value(argv, "--tp-size")),
        "host": _value(argv, "--host"),
        "port": int(_value(argv, "--port")),
        "max_running_requests": int(_value(argv, "--max-running-requests")),
        "cuda_graph_max_bs_decode": int(_value(argv, graph_flag)),
        "decode_graph_max_bs": int(_value(argv, graph_flag)),
        "trust_remote_code": "--trust-remote-code" in argv,
        "enable_metrics": "--enable-metrics" in argv,
        "disable_custom_all_reduce": "--disable-custom-all-reduce" in argv,
        "disable_overlap_schedule": "--disable-overlap-schedule" in argv,
        "speculative_algorithm": None,
    }
    if "--chunked-prefill-size" in argv:
        says["chunked_prefill_size"] = int(_value(argv, "--chunked-prefill-size"))
    if "--attention-backend" in argv:
        says["attention_backend"] = _value(argv, "--attention-backend")
    if "--mem-fraction-static" in argv:
        says["mem_fraction_static"] = float(_value(argv, "--mem-fraction-static"))
    if "--speculative-algorithm" in argv:
        says["speculative_algorithm"] = _value(argv, "--speculative-algorithm")
        says["speculative_draft_model_path"] = _value(argv, "--speculative-draft-model-path")
        says["speculative_num_steps"] = int(_value(argv, "--speculative-num-steps"))
        says["speculative_eagle_topk"] = int(_value(argv, "--speculative-eagle-topk"))
        says["speculative_num_draft_tokens"] = int(_value(argv, "--speculative-num-draft-tokens"))
        says["speculative_adaptive"] = "--speculative-adaptive" in argv
    return says


def argv_count(argv: Sequence[str], flag: str) -> int:
    return sum(1 for arg in argv if arg == flag)


def _minimal(models: FakeModels, *flags: str) -> tuple[str, ...]:
    return ("--model-path", str(models.target), *DEVICE, *flags)


@pytest.fixture(scope="module")
def lines(fake_models: FakeModels) -> dict[str, Line]:
    """Every experiment x kind launch line rayspec builds (experiments for another SGLang
    version than the pinned one are left out)."""
    built: dict[str, Line] = {}
    for exp in EXPERIMENTS:
        for kind, (make, extra) in KINDS.items():
            cfg = load_config(exp, [*_overrides(fake_models), *extra])
            if parse_sglang_version(cfg.server.sglang_version) != parse_sglang_version(PINNED):
                continue
            space_cfg = load_config(exp, [*_overrides(fake_models), *SPACE_OVERRIDES])
            candidate = make(space_cfg)
            launch = build_launch(cfg, candidate, port=PORT, log_path="-")
            assert launch.argv[1:3] == ("-m", "sglang.launch_server")
            built[f"{exp.stem}-{kind}"] = Line(cfg, candidate, launch)
    return built


@pytest.fixture(scope="module")
def resolved(
    lines: dict[str, Line], fake_models: FakeModels, run_probe: ProbeRunner
) -> dict[str, dict[str, Any]]:
    """SGLang's verdict on every line of this module, from one run of the probe."""
    cases = [line.probe_case(name) for name, line in lines.items()]
    # A topk-1 chain handed to build_launch with ndt 8, bypassing rayspec's search space.
    raw_cfg = load_config(EXPERIMENTS[0], _overrides(fake_models))
    raw_candidate = Candidate(spec=SpecSettings("EAGLE3", 2, 1, 8))
    raw = Line(
        raw_cfg, raw_candidate, build_launch(raw_cfg, raw_candidate, port=PORT, log_path="-")
    )
    graph_flag = cuda_graph_flag(PINNED)
    removed = sglang_features(PINNED).rejected_graph_flags[0]
    cases += [
        raw.probe_case("raw-topk1-ndt8"),
        ProbeCase(id="graph-flag", argv=_minimal(fake_models, graph_flag, "24")),
        ProbeCase(id="removed-flag", argv=_minimal(fake_models, removed, "64")),
        # The same through the real module, as `python -m sglang.launch_server` runs it.
        ProbeCase(
            id="removed-flag-cli", argv=_minimal(fake_models, removed, "64"), entry="launch_server"
        ),
        ProbeCase(id="no-device", argv=_minimal(fake_models)[:2]),
        ProbeCase(
            id="device-cpu",
            argv=("--model-path", str(fake_models.target), "--device", "cpu", graph_flag, "48"),
        ),
    ]
    return run_probe(cases)


@pytest.mark.parametrize("name", LINE_CASES)
def test_sglang_resolves_what_the_line_says(
    name: str, lines: dict[str, Line], resolved: dict[str, dict[str, Any]]
) -> None:
    if name not in lines:
        pytest.skip(f"{name}: the experiment targets another SGLang version than {PINNED}")
    line = lines[name]
    result = resolved[name]
    assert result["ok"], f"SGLang {PINNED} rejected rayspec's line: {result}"
    says = line_says(line.argv, cuda_graph_flag(line.cfg.server.sglang_version))
    got = {key: result["values"][key] for key in says}
    assert got == says
    # The caps are the ones rayspec pins, not SGLang's (48 with speculation, GPU tables).
    srv = line.cfg.server
    knobs = line.candidate.knobs
    running = knobs.get("max_running_requests", srv.max_running_requests)
    assert got["max_running_requests"] == running
    graph_bs = knobs.get("cuda_graph_max_bs", srv.cuda_graph_max_bs or running)
    assert got["decode_graph_max_bs"] == graph_bs
    assert argv_count(line.argv, "--max-running-requests") == 1
    if "chunked_prefill_size" in knobs:
        assert got["chunked_prefill_size"] == knobs["chunked_prefill_size"]
    assert got["tp_size"] == srv.tp_size and got["host"] == srv.host and got["port"] == PORT
    spec = line.candidate.spec
    if spec is not None:
        assert got["speculative_num_draft_tokens"] == spec.num_draft_tokens
        if spec.eagle_topk == 1:  # SGLang forces ndt = steps + 1; rayspec already passes it
            assert got["speculative_num_draft_tokens"] == spec.num_steps + 1
        assert not any("is adjusted" in msg for msg in result["log"]), result["log"]
        # SGLang kept adaptive on (no "speculative_adaptive disabled: ..." fallback).
        assert got["speculative_adaptive"] == spec.adaptive, result["log"]
        assert got["disable_overlap_schedule"] == (not spec.overlap)
        non_overlap = any("Non-overlap (synchronous) spec v2" in m for m in result["log"])
        assert non_overlap == (not spec.overlap), result["log"]


def test_topk1_chain_asking_for_more_draft_tokens_gets_steps_plus_one(
    lines: dict[str, Line],
) -> None:
    asked = [line for name, line in lines.items() if name.endswith("-chain-asks-ndt8")]
    assert asked, "no experiment for the pinned SGLang version"
    for line in asked:  # steps 2: 3 draft tokens, not 8
        assert _value(line.argv, "--speculative-num-draft-tokens") == "3"


def test_sglang_itself_forces_topk1_ndt(resolved: dict[str, dict[str, Any]]) -> None:
    # What rayspec's normalisation mirrors (docs/sglang.md, *Speculative rules*: topk 1 forces the
    # draft tokens).
    result = resolved["raw-topk1-ndt8"]
    assert result["ok"], result
    assert result["values"]["speculative_num_draft_tokens"] == 3
    assert (
        "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 "
        "when speculative_eagle_topk == 1"
    ) in result["log"]


def test_version_table_graph_flag_is_accepted(resolved: dict[str, dict[str, Any]]) -> None:
    assert sglang_features(PINNED).contract_pinned
    result = resolved["graph-flag"]
    assert result["ok"], result
    assert result["values"]["cuda_graph_max_bs_decode"] == 24
    assert result["values"]["decode_graph_max_bs"] == 24


@pytest.mark.parametrize("case", ["removed-flag", "removed-flag-cli"])
def test_removed_graph_flag_is_rejected_as_ambiguous(
    case: str, resolved: dict[str, dict[str, Any]]
) -> None:
    assert "--cuda-graph-max-bs" in sglang_features(PINNED).rejected_graph_flags
    result = resolved[case]
    assert not result["ok"] and result["exit_code"] == 2, result
    assert (
        "error: ambiguous option: --cuda-graph-max-bs could match "
        "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"
    ) in result["stderr"]


def test_resolution_without_a_gpu_needs_a_device(resolved: dict[str, dict[str, Any]]) -> None:
    result = resolved["no-device"]
    assert not result["ok"] and result["error"] == "RuntimeError", result
    assert "No accelerator" in result["message"]


def test_device_cpu_would_clamp_the_graph_cap(resolved: dict[str, dict[str, Any]]) -> None:
    # Why the probe resolves with --device cuda: the CPU path lowers the decode graph cap.
    result = resolved["device-cpu"]
    assert result["ok"], result
    assert result["values"]["cuda_graph_max_bs_decode"] == 48
    assert result["values"]["decode_graph_max_bs"] < 48
