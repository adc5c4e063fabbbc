"""The fuzz suite's closing count: cases generated and how they ended (pytest's summary)."""

from __future__ import annotations

from typing import Any


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from tests.fuzz_tests.test_config_fuzz import COUNTS

    if COUNTS:
        parts = ", ".join(f"{k} {v}" for k, v in sorted(COUNTS.items()))
        terminalreporter.write_line(f"rayspec fuzz: {parts}")
