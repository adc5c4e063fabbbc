"""Fixtures of the SGLang contract tests: the cached SGLang env, fake models, the probe.

Every test in this folder needs the CPU-only SGLang env that ``.ci/sglang-env`` builds (once
per machine) at ``${RAYSPEC_CACHE:-/var/tmp/rayspec-cache}/sglang-<version>-cpu-serve/``. Without
it, every test here skips and says how to build it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.contract_tests._sglang import FakeModels
from tests.contract_tests._sglang import ProbeCase
from tests.contract_tests._sglang import ProbeRunner
from tests.contract_tests._sglang import run_probe as _run_probe
from tests.contract_tests._sglang import sglang_python_or_skip
from tests.contract_tests._sglang import write_fake_models


@pytest.fixture(scope="session")
def sglang_python() -> Path:
    """The cached SGLang env's Python, or a skip that says how to build the env."""
    return sglang_python_or_skip()


@pytest.fixture(autouse=True)
def _needs_sglang_env(sglang_python: Path) -> None:
    """Every test in this folder skips without the env."""


@pytest.fixture(scope="session")
def fake_models(tmp_path_factory: pytest.TempPathFactory) -> FakeModels:
    """A Llama target and its EAGLE-3 draft, each a folder with only a ``config.json``."""
    return write_fake_models(tmp_path_factory.mktemp("fake-models"))


@pytest.fixture(scope="session")
def run_probe(sglang_python: Path, tmp_path_factory: pytest.TempPathFactory) -> ProbeRunner:
    """A function that resolves a batch of launch lines with SGLang, in one process."""
    workdir = tmp_path_factory.mktemp("sglang-probe")

    def run(cases: Sequence[ProbeCase]) -> dict[str, dict[str, Any]]:
        return _run_probe(sglang_python, cases, workdir)

    return run
