"""The engine seam: SGLang's knowledge lives in one object, and rayspec asks that object.

Each test swaps or reads the engine object and checks that the layer above follows it: the
config checks read its flag tables and parser rule, the command builder its module and
spelling, a twin is SGLang's dialect with another process.
"""

from __future__ import annotations

import dataclasses

import pytest

from rayspec._config import load_config
from rayspec._exceptions import ConfigError
from rayspec._types import Candidate
from rayspec._types import LaunchSpec
from rayspec.engines import ENGINES
from rayspec.engines import SGLANG
from rayspec.engines import TWIN
from rayspec.engines import Engine
from rayspec.engines import FlagTable
from rayspec.engines import deploy_lines
from rayspec.engines import engine_named
from rayspec.server import build_launch
from tests.helpers import FIELD_EXPERIMENT
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import cached_config

PATHS = ["server.model_path=/models/target", "server.draft_model_path=/models/draft"]


def test_the_twin_is_sglangs_dialect_with_another_process() -> None:
    assert type(TWIN) is type(SGLANG)
    assert (TWIN.flags, TWIN.endpoints, TWIN.metrics, TWIN.label) == (
        SGLANG.flags,
        SGLANG.endpoints,
        SGLANG.metrics,
        SGLANG.label,
    )
    assert (TWIN.name, TWIN.module) == ("twin", "rayspec.twin.server")
    assert TWIN.deploys_as == SGLANG.name == SGLANG.deploys_as == "sglang"
    assert ENGINES == {"sglang": SGLANG, "twin": TWIN}


def test_an_engine_knows_the_argv_that_runs_it() -> None:
    assert SGLANG.runs_module(["python", "-m", "sglang.launch_server", "--port", "1"])
    assert TWIN.runs_module(["python", "-m", "rayspec.twin.server"])
    assert TWIN.runs_module(["python", "/src/rayspec/twin/server.py"])
    assert not TWIN.runs_module(["python", "-m", "sglang.launch_server"])
    assert not SGLANG.runs_module(["python", "-m", "rayspec.twin.server"])


def test_an_unknown_engine_is_named_with_those_that_exist() -> None:
    with pytest.raises(KeyError, match=r"'vllm'; expected one of \['sglang', 'twin'\]"):
        engine_named("vllm")


def test_the_engine_is_an_abstract_seam() -> None:
    with pytest.raises(TypeError, match="abstract"):
        Engine(  # type: ignore[abstract]
            name="x",
            label="X",
            module="x",
            deploys_as="x",
            flags=SGLANG.flags,
            endpoints=SGLANG.endpoints,
            metrics=SGLANG.metrics,
        )


def test_the_config_checks_read_the_engines_flag_table(monkeypatch) -> None:
    # A flag the engine's table protects is refused as the engine's parser reads it (a prefix).
    flags = dataclasses.replace(SGLANG.flags, dead=(*SGLANG.flags.dead, "--made-up-knob"))
    monkeypatch.setitem(ENGINES, "sglang", dataclasses.replace(SGLANG, flags=flags))
    with pytest.raises(ConfigError) as err:
        load_config(FIELD_EXPERIMENT, [*PATHS, "server.extra_flags=[--made-up-k]"])
    assert str(err.value) == (
        "server.extra_flags: --made-up-k (SGLang reads it as --made-up-knob: its parser takes "
        "unique prefixes) is parsed but never read by SGLang; searching it measures only noise"
    )
    monkeypatch.setitem(ENGINES, "sglang", SGLANG)
    load_config(FIELD_EXPERIMENT, [*PATHS, "server.extra_flags=[--made-up-k]"])


def test_every_flag_table_is_one_the_config_refuses() -> None:
    for table in dataclasses.fields(FlagTable):
        for flag in getattr(SGLANG.flags, table.name):
            with pytest.raises(ConfigError, match=r"^server\.extra_flags: "):
                load_config(FIELD_EXPERIMENT, [*PATHS, f"server.extra_flags=[{flag}]"])


def test_the_launch_runs_the_engines_module(monkeypatch, tmp_path) -> None:
    cfg = cached_config(TWIN_EXPERIMENT, out=tmp_path)
    assert build_launch(cfg, Candidate(), port=1, log_path="-").argv[1:3] == (
        "-m",
        "rayspec.twin.server",
    )
    other = TWIN.with_process("twin", "elsewhere.server")
    monkeypatch.setitem(ENGINES, "twin", other)
    launch = build_launch(cfg, Candidate(), port=1, log_path="-")
    assert launch.argv[1:3] == ("-m", "elsewhere.server") and launch.engine == "twin"


def test_deploy_lines_unset_export_then_exec_with_placeholders_verbatim() -> None:
    launch = LaunchSpec(
        argv=("python", "-m", "sglang.launch_server", "--model-path", "${M}", "--x", "a b"),
        env=(("NCCL_NVLS_ENABLE", "0"), ("V", "it's")),
        host="127.0.0.1",
        port=1,
        log_path="-",
        startup_timeout_s=1.0,
        engine="sglang",
        unset_env=("NCCL_ALGO",),
    )
    assert deploy_lines(launch, {"${M}": '"${M:?set M}"'}) == [
        "unset NCCL_ALGO",
        "export NCCL_NVLS_ENABLE=0",
        "export V='it'\"'\"'s'",
        'exec python -m sglang.launch_server --model-path "${M:?set M}" --x \'a b\' "$@"',
    ]
