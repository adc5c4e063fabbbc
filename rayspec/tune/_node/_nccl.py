"""NCCL values, with the twin's own parser (so the two never disagree)."""

from __future__ import annotations

from rayspec._config import UNSET
from rayspec._config import ExperimentConfig
from rayspec._config import TwinConfig
from rayspec.tune._node._findings import Findings

# NCCL integer parameters the tuner sets (NCCL reads them with strtoll, base 0).
_NCCL_INTEGERS = (
    "NCCL_NTHREADS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NRINGS",
    "NCCL_MIN_NRINGS",
    "NCCL_BUFFSIZE",
    "NCCL_SHM_DISABLE",
)


def check_nccl_values(cfg: ExperimentConfig) -> Findings:
    """Every value of ``search.nccl`` and ``server.env`` is one NCCL accepts and uses.

    Refused: an unknown ``NCCL_PROTO``/``NCCL_ALGO`` token (communicator init fails), an
    ``NCCL_P2P_LEVEL`` NCCL does not know (ignored silently: the names are case-sensitive), a
    non-integer integer parameter (ignored: NCCL keeps its default).
    """
    from rayspec.twin import NcclInitError
    from rayspec.twin import load_profile
    from rayspec.twin._nccl import ALGORITHMS
    from rayspec.twin._nccl import PROTOCOLS
    from rayspec.twin._nccl import _int_var
    from rayspec.twin._nccl import _p2p_level
    from rayspec.twin._nccl import _parse_list

    # NCCL's level names; every shipped profile lists the same (nccl_choice.path_order).
    profile = load_profile(TwinConfig().profile)
    levels = profile.nccl_choice.path_order
    values = [(f"search.nccl.{n}", n, v) for n, vs in cfg.search.nccl.items() for v in vs]
    values += [(f"server.env.{n}", n, v) for n, v in cfg.server.env.items()]
    out = Findings()
    for key, name, value in values:
        if value == UNSET and key.startswith("search."):
            continue
        notes: list[str] = []
        if name in ("NCCL_PROTO", "NCCL_ALGO"):
            names = PROTOCOLS if name == "NCCL_PROTO" else ALGORITHMS
            try:
                _parse_list(value, name, names)
            except NcclInitError as exc:
                detail = str(exc).splitlines()[0].removeprefix("NCCL WARN ")
                out.problems.append(
                    f"{key}: {value!r}: NCCL refuses it at communicator init ({detail}): "
                    f"every trial with it would fail; use {', '.join(names)}"
                )
        elif name == "NCCL_P2P_LEVEL":
            _p2p_level({name: value}, profile, notes)
            if notes:
                fix = value.upper() if value.upper() in levels else f"one of {', '.join(levels)}"
                out.problems.append(
                    f"{key}: {value!r}: NCCL ignores it silently (case-sensitive): use {fix}"
                )
        elif name in _NCCL_INTEGERS:
            _int_var({name: value}, (name,), notes)
            if notes:
                out.problems.append(
                    f"{key}: {value!r} is not an integer: NCCL ignores it and keeps its "
                    "default, so trials with it measure the default"
                )
    return out
