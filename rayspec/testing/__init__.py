"""Contract test suites for implementations of rayspec's interfaces (needs pytest)."""

from __future__ import annotations

from rayspec.testing._store import TrialStoreTestCase

__all__ = ["TrialStoreTestCase"]
