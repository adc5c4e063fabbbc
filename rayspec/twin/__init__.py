"""rayspec.twin: the digital twin, a simulated SGLang node with a calibrated performance model.

The model (pure): :func:`load_profile`, :func:`resolve_nccl`, :class:`PerfModel`,
:class:`NoiseModel`. The server (a process): ``python -m rayspec.twin.server`` with SGLang's
flags plus ``--twin-*``; :func:`resolve_server_args` is SGLang's argument resolution it uses.
"""

from __future__ import annotations

from rayspec.twin._errors import DraftTreeError
from rayspec.twin._errors import NcclError
from rayspec.twin._errors import NcclForbiddenError
from rayspec.twin._errors import NcclInitError
from rayspec.twin._errors import NcclNoAlgorithmError
from rayspec.twin._errors import ProfileError
from rayspec.twin._model import PerfModel
from rayspec.twin._model import build_draft_tree
from rayspec.twin._nccl import ALGORITHMS as NCCL_ALGORITHMS
from rayspec.twin._nccl import PROTOCOLS as NCCL_PROTOCOLS
from rayspec.twin._nccl import NcclSetup
from rayspec.twin._nccl import nccl_int_var
from rayspec.twin._nccl import nccl_p2p_level
from rayspec.twin._nccl import parse_nccl_list
from rayspec.twin._nccl import resolve_nccl
from rayspec.twin._noise import NoiseModel
from rayspec.twin._noise import RequestNoise
from rayspec.twin._profile import Profile
from rayspec.twin._profile import available_profiles
from rayspec.twin._profile import load_profile
from rayspec.twin._resolve import DEFAULT_CONTEXT_LEN
from rayspec.twin._resolve import Resolution
from rayspec.twin._resolve import resolve_server_args
from rayspec.twin._served import mismatches

__all__ = [
    "DEFAULT_CONTEXT_LEN",
    "NCCL_ALGORITHMS",
    "NCCL_PROTOCOLS",
    "DraftTreeError",
    "NcclError",
    "NcclForbiddenError",
    "NcclInitError",
    "NcclNoAlgorithmError",
    "NcclSetup",
    "NoiseModel",
    "PerfModel",
    "Profile",
    "ProfileError",
    "RequestNoise",
    "Resolution",
    "available_profiles",
    "mismatches",
    "build_draft_tree",
    "load_profile",
    "nccl_int_var",
    "nccl_p2p_level",
    "parse_nccl_list",
    "resolve_nccl",
    "resolve_server_args",
]
