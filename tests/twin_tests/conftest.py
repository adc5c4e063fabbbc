"""Fixtures for the twin server tests: start twins as subprocesses and always clean them up."""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence

import pytest

from rayspec.testing import FIELD_TUNED_NCCL
from rayspec.testing import eagle3_flags
from rayspec.testing._twin import TwinProcess

SPEC_ARGS = ("--tp-size", "8", *eagle3_flags(2))
TUNED_NCCL = dict(FIELD_TUNED_NCCL)

StartTwin = Callable[..., TwinProcess]


@pytest.fixture
def start_twin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StartTwin]:
    """``start_twin(args, env=..., ready=True)`` -> a started twin, stopped after the test."""
    started: list[TwinProcess] = []

    def start(
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        ready: bool = True,
        startup_s: float = 0.2,
    ) -> TwinProcess:
        log = tmp_path_factory.mktemp("twin") / "server.log"
        twin = TwinProcess(args, env=env, startup_s=startup_s, log_path=str(log)).start()
        started.append(twin)
        if ready:
            twin.wait_ready(timeout_s=30)
        return twin

    yield start
    for twin in started:
        twin.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The twin HTTP fuzz's closing count: cases generated, how they ended."""
    from tests.twin_tests.test_twin_http_fuzz import COUNTS
    from tests.twin_tests.test_twin_http_fuzz import HELD_MS
    from tests.twin_tests.test_twin_http_fuzz import INVARIANTS

    if COUNTS:
        total = sum(COUNTS.values())
        parts = ", ".join(f"{k} {v}" for k, v in sorted(COUNTS.items()))
        terminalreporter.write_line(
            f"twin HTTP fuzz: {total} cases, {INVARIANTS} invariants each (the loop held "
            f"{max(HELD_MS, default=0):.0f} ms of CPU at most): {parts}"
        )
