"""Errors raised by the twin's performance model (profiles, NCCL resolution, draft trees).

::

    RayspecError
    ├── ProfileError (also ValueError)      a profile YAML is missing, unknown or malformed
    ├── NcclError                           a simulated NCCL failure
    │   ├── NcclInitError                   fails at communicator init (bad NCCL_PROTO/ALGO token)
    │   │   └── NcclForbiddenError          NVLink multicast asked for where it must stay off
    │   └── NcclNoAlgorithmError            fails at the first collective (no usable algorithm)
    └── DraftTreeError (also RuntimeError)  draft-token budget larger than the tree (first decode;
                                            defined in rayspec/_drafttree.py, re-exported here)

The NCCL errors and :class:`DraftTreeError` carry the :class:`~rayspec.FailureReason` the real
server's failure would be classified as, in ``reason`` (docs/twin-model.md, *NCCL variables*;
docs/sglang.md, *Speculative rules*).
"""

from __future__ import annotations

from rayspec._drafttree import DraftTreeError
from rayspec._exceptions import FailureReason
from rayspec._exceptions import RayspecError

__all__ = [
    "DraftTreeError",
    "NcclError",
    "NcclForbiddenError",
    "NcclInitError",
    "NcclNoAlgorithmError",
    "ProfileError",
]


class ProfileError(RayspecError, ValueError):
    """A profile cannot be loaded; the message names the dotted key and what is expected."""


class NcclError(RayspecError):
    """A simulated NCCL failure.

    Attributes:
        reason: how the real server's failure is classified.
        nccl_result: NCCL's result code name, e.g. ``"ncclInvalidUsage"``.
    """

    reason: FailureReason = FailureReason.UNKNOWN

    def __init__(self, message: str, *, nccl_result: str = "ncclInvalidUsage") -> None:
        super().__init__(message)
        self.nccl_result = nccl_result


class NcclInitError(NcclError):
    """NCCL refuses to create the communicator (the server dies during distributed init)."""

    reason = FailureReason.NCCL_INIT


class NcclForbiddenError(NcclInitError):
    """NVLink multicast (NVLS) was asked for on a machine where it must stay off
    (docs/twin-model.md, *NCCL variables*).

    rayspec must never generate such a trial; the twin rejects it loudly at communicator init.
    """


class NcclNoAlgorithmError(NcclError):
    """No algorithm/protocol is usable for AllReduce (the server dies at its first collective)."""

    reason = FailureReason.NCCL_FIRST_COLLECTIVE
