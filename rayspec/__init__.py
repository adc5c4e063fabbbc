"""rayspec: find the fastest way to serve a large model with speculative decoding."""

from __future__ import annotations

from rayspec._exceptions import BenchError
from rayspec._exceptions import ConfigError
from rayspec._exceptions import FailureReason
from rayspec._exceptions import LaunchError
from rayspec._exceptions import RayspecError
from rayspec._exceptions import ServerExited
from rayspec._exceptions import ServerStartTimeout
from rayspec._exceptions import StoreError
from rayspec._exceptions import StreamStalled
from rayspec._types import Candidate
from rayspec._types import LaunchSpec
from rayspec._types import RequestRecord
from rayspec._types import SpecSettings
from rayspec._types import TrialRecord
from rayspec._types import TrialResult
from rayspec._version import __version__

__all__ = [
    "BenchError",
    "Candidate",
    "ConfigError",
    "FailureReason",
    "LaunchError",
    "LaunchSpec",
    "RayspecError",
    "RequestRecord",
    "ServerExited",
    "ServerStartTimeout",
    "SpecSettings",
    "StoreError",
    "StreamStalled",
    "TrialRecord",
    "TrialResult",
    "__version__",
]
