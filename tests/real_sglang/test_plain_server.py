"""The real SGLang server without speculation, with the scaffolding: it serves, says what it is,
and leaves no process behind."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers import pids_alive
from tests.real_sglang._models import TinyModels
from tests.real_sglang._runs import MAX_NEW_TOKENS
from tests.real_sglang._runs import PROMPTS
from tests.real_sglang._runs import ServerRun
from tests.real_sglang._runs import metric
from tests.real_sglang._runs import target_flags
from tests.real_sglang._server import RealServer
from tests.real_sglang._server import ServerFailed
from tests.real_sglang._server import scaffold_env

# A test's timeout covers its fixtures: the first here starts a server (70-80 s on a loaded
# 2-core machine); the same room as the EAGLE module, well past a healthy start.
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def plain(plain_run: ServerRun) -> ServerRun:
    return plain_run


def test_greedy_generate_answers_with_every_token(plain: ServerRun) -> None:
    assert len(plain.outputs) == len(PROMPTS)
    for out in plain.outputs:
        meta = out["meta_info"]
        assert meta["completion_tokens"] == MAX_NEW_TOKENS
        assert len(out["output_ids"]) == MAX_NEW_TOKENS
        assert meta["finish_reason"] == {"type": "length", "length": MAX_NEW_TOKENS}
        assert isinstance(out["text"], str) and out["text"]
        assert not any(k.startswith("spec_") for k in meta)


def test_server_info_names_the_cpu_and_the_amx_backend_the_scaffolding_kept(
    plain: ServerRun,
) -> None:
    info = plain.server_info
    assert info["version"] == "0.5.23"
    assert info["device"] == "cpu"
    # Without the AMX override SGLang falls back to torch_native (logged as a warning).
    assert info["attention_backend"] == "intel_amx"
    assert "will fallback to torch_native" not in plain.log
    assert info["speculative_algorithm"] is None


def test_metrics_count_the_generated_tokens(plain: ServerRun) -> None:
    """The readiness probes generate a token each too: count the prompts' tokens as a delta."""
    name = "sglang:generation_tokens_total"
    delta = metric(plain.metrics, name) - metric(plain.metrics_before, name)
    assert delta == len(PROMPTS) * MAX_NEW_TOKENS


def test_the_scaffolding_reached_the_spawned_children(plain: ServerRun) -> None:
    """sitecustomize ran in the server and in the scheduler and detokenizer it spawned."""
    pids_logged = {int(line.split()[0]) for line in plain.site_log}
    server, *children = plain.tree
    assert server in pids_logged
    spawned = [line for line in plain.site_log if "--multiprocessing-fork" in line]
    assert len(spawned) >= 2  # scheduler and detokenizer
    assert all(int(line.split()[1]) == server for line in spawned)


def test_sglang_registered_only_the_tiny_models_modules(plain: ServerRun) -> None:
    """RAYSPEC_TEST_MODEL_MODULES: the ~150 other model modules are not even imported."""
    assert "Ignore import error when loading sglang.srt.models." not in plain.log
    assert "type=LlamaForCausalLM" in plain.log  # SGLang's weight-loading line


def test_stopping_leaves_no_process_of_the_tree(plain: ServerRun) -> None:
    assert len(plain.tree) >= 3  # the server and at least its scheduler and detokenizer
    assert plain.alive_after_stop == ()


def _env_python(python: Path, code: str, env: dict[str, str]) -> str:
    out = subprocess.run(
        [str(python), "-c", code],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", **env},
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_the_env_imports_the_stand_in_kernel_package(sglang_python: Path) -> None:
    code = "import sgl_kernel; print(sgl_kernel.IS_RAYSPEC_TEST_STAND_IN)"
    assert _env_python(sglang_python, code, scaffold_env()) == "True"


@pytest.mark.parametrize("fake_amx", [True, False])
def test_the_amx_override_comes_from_the_environment_alone(
    sglang_python: Path, fake_amx: bool
) -> None:
    """Only ``RAYSPEC_TEST_FAKE_AMX=1`` makes SGLang's platform facts say AMX (none here)."""
    code = (
        "from sglang.srt.runtime_context import get_platform; "
        "from sglang.srt.utils.common import cpu_has_amx_support; "
        "print(get_platform().has_amx, cpu_has_amx_support())"
    )
    out = _env_python(sglang_python, code, scaffold_env(fake_amx=fake_amx))
    assert out == f"{fake_amx} False"


def test_a_server_that_cannot_start_fails_with_its_log_tail(
    real_server: RealServer, tiny_models: TinyModels
) -> None:
    """The helper's own failure path: SGLang's exit code and last log lines, nothing left."""
    stopped: list[int] = []
    flags = [*target_flags(tiny_models), "--no-such-flag"]
    with pytest.raises(ServerFailed) as failed:
        with real_server(flags, stopped=stopped):
            pass  # pragma: no cover - never ready
    message = str(failed.value)
    assert "SGLang exited with 2 before it was ready" in message
    assert "--no-such-flag" in message  # argparse names it in the log tail
    assert stopped and pids_alive(stopped) == []
