"""Fixtures of the real-SGLang tests: the cached SGLang env, the tiny models, real servers.

Every test here starts (or uses results of) the real ``python -m sglang.launch_server`` on this
CPU, with the test scaffolding of ``_site/`` (see ``docs/real-sglang-cpu.md``). Without the env
that ``.ci/sglang-env`` builds, every test here skips and says how to build it.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from collections.abc import Sequence
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path

import pytest

from tests.contract_tests._sglang import MARKER
from tests.contract_tests._sglang import PINNED
from tests.contract_tests._sglang import sglang_env_dir
from tests.real_sglang._models import TinyModels
from tests.real_sglang._models import tiny_models as _tiny_models
from tests.real_sglang._runs import RUNS
from tests.real_sglang._runs import ServerRun
from tests.real_sglang._runs import serve_and_collect
from tests.real_sglang._runs import summary
from tests.real_sglang._runs import target_flags
from tests.real_sglang._server import RealServer
from tests.real_sglang._server import real_server as _real_server


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """What each real server did (seconds are for the log, never asserted)."""
    for run in RUNS:
        terminalreporter.write_line(f"real SGLang {summary(run)}")


@pytest.fixture(scope="session")
def sglang_python() -> Path:
    """The cached SGLang env's Python, or a skip that says how to build the env."""
    env = sglang_env_dir()
    python = env / "bin" / "python"
    if not (env / MARKER).is_file() or not python.exists():
        pytest.skip(
            f"no cached SGLang {PINNED} env at {env} (RAYSPEC_CACHE picks the folder): "
            "build it once with `bash .ci/sglang-env` (a few minutes, 7 GB)"
        )
    return python


@pytest.fixture(autouse=True)
def _needs_sglang_env(sglang_python: Path) -> None:
    """Every test in this folder skips without the env."""


@pytest.fixture(scope="session")
def tiny_models(sglang_python: Path) -> TinyModels:
    """The tiny target, EAGLE-3 draft and always-agreeing pair (made once per recipe)."""
    return _tiny_models(sglang_python)


@pytest.fixture(scope="session")
def real_server(sglang_python: Path, tmp_path_factory: pytest.TempPathFactory) -> RealServer:
    """``real_server(flags, env=None, stopped=None)``: a context manager around a real server.

    It yields ``(base_url, log_path)`` once ``/health_generate`` answers; the flags follow
    ``python -m sglang.launch_server`` (the CPU flags, host and port are added). On exit the
    whole process tree is stopped; ``stopped`` receives its pids.
    """
    logs = tmp_path_factory.mktemp("sglang-logs")
    counter = itertools.count()

    def start(
        flags: Sequence[str],
        env: Mapping[str, str] | None = None,
        stopped: list[int] | None = None,
    ) -> ContextManager[tuple[str, Path]]:
        log_path = logs / f"server-{next(counter)}.log"
        return _real_server(sglang_python, flags, log_path, env=env, stopped=stopped)

    return start


@pytest.fixture(scope="session")
def plain_run(
    real_server: RealServer, tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory
) -> ServerRun:
    """One run of the real server without speculation (the greedy reference of every test)."""
    return serve_and_collect(
        "plain", real_server, target_flags(tiny_models), tmp_path_factory.mktemp("plain")
    )
