"""The fuzz suite's closing count: cases generated and how they ended (pytest's summary)."""

from __future__ import annotations

from typing import Any


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from tests.fuzz_tests.test_config_fuzz import COUNTS
    from tests.fuzz_tests.test_resume_fuzz import RESUME_COUNTS

    for name, counts in (("rayspec fuzz", COUNTS), ("rayspec resume fuzz", RESUME_COUNTS)):
        if counts:
            parts = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            terminalreporter.write_line(f"{name}: {parts}")
