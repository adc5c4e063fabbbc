"""The search space and the Optuna study (the only package that imports optuna)."""

from __future__ import annotations

from rayspec.search._space import SearchSpace
from rayspec.search._space import canonical_key
from rayspec.search._study import StudyHandle
from rayspec.search._study import open_study
from rayspec.search._study import validate_enqueue

__all__ = ["SearchSpace", "StudyHandle", "canonical_key", "open_study", "validate_enqueue"]
