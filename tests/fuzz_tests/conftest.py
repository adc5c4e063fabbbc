"""The fuzz suite's closing count: cases generated and how they ended (pytest's summary)."""

from __future__ import annotations

import sys
from typing import Any


def pytest_terminal_summary(terminalreporter: Any) -> None:
    # Only the modules this run imported (a run of one file counts that file).
    for module, name, label in (
        ("tests.fuzz_tests.test_config_fuzz", "COUNTS", "rayspec fuzz"),
        ("tests.fuzz_tests.test_prompt_fuzz", "PROMPT_COUNTS", "rayspec prompt fuzz"),
        ("tests.fuzz_tests.test_resume_fuzz", "RESUME_COUNTS", "rayspec resume fuzz"),
    ):
        counts = getattr(sys.modules.get(module), name, None)
        if counts:
            parts = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            terminalreporter.write_line(f"{label}: {parts}")
