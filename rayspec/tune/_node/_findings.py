"""Findings: what preflight refuses (problems) and what it only says (warnings)."""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field


@dataclass
class Findings:
    """Problems (refuse the study) and warnings (print them, go on), one line each."""

    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def extend(self, other: Findings) -> None:
        self.problems.extend(other.problems)
        self.warnings.extend(other.warnings)
