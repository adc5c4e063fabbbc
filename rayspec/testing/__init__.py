"""Contract test suites, the field's reference settings, and trial functions without a server:
:class:`SimulatedTrials` (the twin's model), :class:`ReplayedTrials` (a recorded landscape;
:func:`synthetic_landscape` writes a toy one).

The suites need pytest; they load on first use, so the reference settings do not.
"""

from __future__ import annotations

from typing import Any

from rayspec.testing._field import FIELD_TUNED_NCCL
from rayspec.testing._field import eagle3_flags

__all__ = [
    "FIELD_TUNED_NCCL",
    "ReplayedTrials",
    "SimulatedTrials",
    "SlottedTrials",
    "TrialStoreTestCase",
    "eagle3_flags",
    "synthetic_landscape",
]


def __getattr__(name: str) -> Any:
    if name == "ReplayedTrials":
        from rayspec.testing._replay import ReplayedTrials

        return ReplayedTrials
    if name == "synthetic_landscape":
        from rayspec.testing._synthland import synthetic_landscape

        return synthetic_landscape
    if name == "SimulatedTrials":
        from rayspec.testing._simtrial import SimulatedTrials

        return SimulatedTrials
    if name == "SlottedTrials":
        from rayspec.testing._slots import SlottedTrials

        return SlottedTrials
    if name == "TrialStoreTestCase":
        from rayspec.testing._store import TrialStoreTestCase

        return TrialStoreTestCase
    raise AttributeError(f"module 'rayspec.testing' has no attribute {name!r}")
