"""The NCCL screen: rank NCCL environment sets by all-reduce latency before any restart."""

from __future__ import annotations

from rayspec.screen._base import BaseNcclScreen
from rayspec.screen._base import ScreenResult
from rayspec.screen._base import ScreenStatus
from rayspec.screen._base import env_key
from rayspec.screen._rank import NcclClass
from rayspec.screen._rank import ScreenReport
from rayspec.screen._rank import screen_space
from rayspec.screen._ray import RayNcclScreen
from rayspec.screen._torch import TorchNcclScreen
from rayspec.screen._torch import WorkerInfo
from rayspec.screen._twin import TwinNcclScreen

__all__ = [
    "BaseNcclScreen",
    "NcclClass",
    "RayNcclScreen",
    "ScreenReport",
    "ScreenResult",
    "ScreenStatus",
    "TorchNcclScreen",
    "TwinNcclScreen",
    "WorkerInfo",
    "env_key",
    "screen_space",
]
