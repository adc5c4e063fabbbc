"""``python -m rayspec.tune``: the study driver.

The package imports its driver lazily, so ``python -m rayspec.tune --help`` and input errors
answer without loading Ray.
"""

from __future__ import annotations

from typing import Any

__all__ = ["StudyOutcome", "run_study"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from rayspec.tune import _driver

        return getattr(_driver, name)
    raise AttributeError(f"module 'rayspec.tune' has no attribute {name!r}")
