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

from tests.contract_tests._sglang import sglang_python_or_skip
from tests.real_sglang._models import TinyModels
from tests.real_sglang._models import tiny_models as _tiny_models
from tests.real_sglang._runs import AGREE
from tests.real_sglang._runs import AGREE_TOKENS
from tests.real_sglang._runs import CHAIN
from tests.real_sglang._runs import PROMPTS
from tests.real_sglang._runs import RUNS
from tests.real_sglang._runs import ServerRun
from tests.real_sglang._runs import eagle_flags
from tests.real_sglang._runs import serve_and_collect
from tests.real_sglang._runs import summary
from tests.real_sglang._runs import target_flags
from tests.real_sglang._server import RealServer
from tests.real_sglang._server import real_server as _real_server
from tests.sglang_dialect import answers as dialect_answers


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """What each real server did (seconds are for the log, never asserted)."""
    for run in RUNS:
        terminalreporter.write_line(f"real SGLang {summary(run)}")


@pytest.fixture(scope="session")
def sglang_python() -> Path:
    """The cached SGLang env's Python, or a skip that says how to build the env."""
    return sglang_python_or_skip()


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
    """One run of the real server without speculation (the greedy reference of every test);
    the contract diff's requests follow the prompts (``run.probed``)."""
    return serve_and_collect(
        "plain", real_server, target_flags(tiny_models), tmp_path_factory.mktemp("plain"),
        probe=dialect_answers,
    )  # fmt: skip


@pytest.fixture(scope="session")
def chain_run(
    real_server: RealServer, tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory
) -> ServerRun:
    """One run of the real server with an EAGLE-3 chain (steps 2, topk 1, 3 draft tokens);
    the contract diff's requests follow the prompts (``run.probed``)."""
    flags = eagle_flags(str(tiny_models.target), str(tiny_models.draft), CHAIN)
    return serve_and_collect(
        "chain", real_server, flags, tmp_path_factory.mktemp("chain"), probe=dialect_answers
    )


@pytest.fixture(scope="session")
def agree_run(
    real_server: RealServer, tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory
) -> ServerRun:
    """One run of the always-agreeing pair (every token is token 0, a special token: no text
    at all); the contract diff's requests follow its prompt (``run.probed``)."""
    flags = eagle_flags(str(tiny_models.agree_target), str(tiny_models.agree_draft), AGREE)
    return serve_and_collect(
        "agree", real_server, flags, tmp_path_factory.mktemp("agree"), prompts=PROMPTS[:1],
        max_new_tokens=AGREE_TOKENS, probe=dialect_answers,
    )  # fmt: skip
