"""NCCL environment resolution and all-reduce latency for the twin (docs/twin-model.md, *NCCL
variables*, *All-reduce latency*).

:func:`resolve_nccl` turns a trial's NCCL variables into an :class:`NcclSetup`:

- parsing, exactly: ``NCCL_PROTO``/``NCCL_ALGO`` lists (``;``-separated entries, an optional
  ``func:`` prefix, ``^`` for "all except", case-insensitive names), ``NCCL_P2P_LEVEL``
  (case-sensitive names, legacy integers), ``NCCL_P2P_DISABLE``, ``NCCL_SHM_DISABLE``,
  ``NCCL_NTHREADS`` and ``NCCL_MAX/MIN_NCHANNELS`` clamping, ``NCCL_GRAPH_FILE``;
- step A: which (algo, proto) NCCL picks, from NCCL's own estimate on the detected
  bandwidth;
- step B: what that pick really costs on the box, per ring-link transport.

Failure timing follows the failure classes: a bad list token raises :class:`NcclInitError`
here (communicator init), and an algorithm list with nothing usable raises
:class:`NcclNoAlgorithmError` from
:meth:`NcclSetup.allreduce_us` (the first collective).

Example::

    setup = resolve_nccl({"NCCL_PROTO": "LL", "NCCL_P2P_LEVEL": "SYS"}, profile)
    setup.choice(14336)        # ("Ring", "LL")
    setup.allreduce_us(14336)  # 24.5
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from rayspec.twin._errors import NcclForbiddenError
from rayspec.twin._errors import NcclInitError
from rayspec.twin._errors import NcclNoAlgorithmError
from rayspec.twin._profile import Profile

__all__ = [
    "ALGORITHMS",
    "PROTOCOLS",
    "NcclSetup",
    "nccl_int_var",
    "nccl_p2p_level",
    "parse_nccl_list",
    "resolve_nccl",
]

#: NCCL's protocol names (``ncclProtoStr``), in NCCL's order.
PROTOCOLS: tuple[str, ...] = ("LL", "LL128", "Simple")
#: NCCL's algorithm names (``ncclAlgoStr``), in NCCL's order.
ALGORITHMS: tuple[str, ...] = (
    "Tree",
    "Ring",
    "CollNetDirect",
    "CollNetChain",
    "NVLS",
    "NVLSTree",
    "PAT",
)
#: Function prefixes accepted by ``parseList`` (``ncclFuncStr``), matched case-insensitively.
_FUNCTIONS: tuple[str, ...] = ("Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce")
_DATATYPE = "ncclBfloat16"

_P2P = "P2P"
_SHM = "SHM"
_NET = "NET"


@dataclasses.dataclass(frozen=True)
class NcclSetup:
    """The NCCL behaviour of one server start: what it picks and what each all-reduce costs.

    Built by :func:`resolve_nccl`; immutable. Sizes are bytes, times µs.

    Attributes:
        env: the NCCL variables it was resolved from.
        protocols: AllReduce protocols left enabled (NCCL order).
        algorithms: AllReduce algorithms that are enabled and exist on this node (NCCL order).
        p2p_level: the effective P2P level name (e.g. ``"PXB"``, ``"SYS"``, ``"LOC"``).
        link_transports: transport of each ring link: ``"P2P"``, ``"SHM"`` or ``"NET"``.
        choice_bw_GBps, choice_nchannels: the detected bandwidth and channel count NCCL's
            estimate runs on (after ``NCCL_GRAPH_FILE`` and the channel bounds).
        max_nchannels: ``NCCL_MAX_NCHANNELS`` after clamping, or None if unset.
        min_nchannels: ``NCCL_MIN_NCHANNELS`` after clamping, or None if unset.
        nthreads: ``NCCL_NTHREADS`` after clamping, or None if unset.
        warnings: lines the server should log (``NCCL WARN``/``NCCL INFO`` style).
        ll128_risk: LL128 is enabled by the user on a ring whose links are not NVLink (silent
            corruption risk, NVIDIA/nccl PR #2053).
        hang: P2P is in use on a platform marked ``p2p_broken`` (the first collective hangs).
    """

    env: Mapping[str, str]
    protocols: tuple[str, ...]
    algorithms: tuple[str, ...]
    p2p_level: str
    link_transports: tuple[str, ...]
    choice_bw_GBps: float
    choice_nchannels: int
    max_nchannels: int | None
    min_nchannels: int | None
    nthreads: int | None
    warnings: tuple[str, ...]
    ll128_risk: bool
    hang: bool
    _profile: Profile = dataclasses.field(repr=False, compare=False)
    _cache: dict[tuple[str, float], object] = dataclasses.field(
        default_factory=dict, repr=False, compare=False
    )

    @property
    def usable(self) -> bool:
        """Whether at least one (algo, proto) pair is left for AllReduce."""
        return bool(self.protocols and self.algorithms)

    @property
    def n_shm(self) -> int:
        return self.link_transports.count(_SHM)

    @property
    def n_net(self) -> int:
        return self.link_transports.count(_NET)

    def estimate_us(self, algo: str, proto: str, nbytes: float) -> float:
        """NCCL's internal time estimate for one AllReduce (step A; not the real cost)."""
        ch = self._profile.nccl_choice
        n = self._profile.hardware.n_ranks
        steps = 2 * (n - 1)
        lat = ch.base_lat_us[algo][proto] + steps * ch.hw_lat_us[algo][proto]
        bus_bw = self.choice_nchannels * self.choice_bw_GBps
        if algo == "Tree":
            tb = ch.tree_bw
            bw = tb.base * bus_bw
            if proto == "LL":
                bw /= tb.LL_div
            elif proto == "LL128":
                bw *= tb.LL128_mul
            alg_bw = tb.alg_mul * bw
        else:
            if proto == "LL":
                bw = min(ch.ll_max_bw_GBps, ch.ring_ll_bw_factor * bus_bw)
            elif proto == "LL128":
                bw = min(
                    ch.ll128_bw_factor * bus_bw,
                    self.choice_nchannels * ch.ll128_per_channel_bw_GBps,
                )
            else:
                bw = bus_bw
            alg_bw = bw * n / steps
        return lat + nbytes / (1000.0 * alg_bw)

    def choice(self, nbytes: float) -> tuple[str, str]:
        """The (algo, proto) NCCL picks for an AllReduce of ``nbytes`` (argmin of its estimate).

        Raises:
            NcclNoAlgorithmError: no algorithm/protocol is usable for AllReduce.
        """
        key = ("choice", float(nbytes))
        if key not in self._cache:
            self._cache[key] = _choice(self, float(nbytes))
        return self._cache[key]  # type: ignore[return-value]

    def allreduce_us(self, nbytes: float) -> float:
        """Real latency of one AllReduce of ``nbytes`` on this box (step B), in µs.

        Raises:
            NcclNoAlgorithmError: no algorithm/protocol is usable for AllReduce (the first
                collective fails).
        """
        key = ("allreduce_us", float(nbytes))
        if key not in self._cache:
            self._cache[key] = _allreduce_us(self, float(nbytes))
        return self._cache[key]  # type: ignore[return-value]

    def describe(self) -> str:
        """One line for logs, e.g. ``P2P level SYS (8 P2P links); AllReduce Ring/LL at 14 KB``."""
        counts = ", ".join(
            f"{self.link_transports.count(t)} {t}"
            for t in (_P2P, _SHM, _NET)
            if t in self.link_transports
        )
        head = f"P2P level {self.p2p_level} ({counts} links)"
        if not self.usable:
            return f"{head}; no AllReduce algorithm/protocol available"
        algo, proto = self.choice(self._profile.model.token_bytes)
        return f"{head}; AllReduce {algo}/{proto} at one token"


def _choice(setup: NcclSetup, nbytes: float) -> tuple[str, str]:
    if not setup.usable:
        raise _no_algorithm(setup)
    best: tuple[float, str, str] | None = None
    # NCCL scans algorithms then protocols and keeps the first strict minimum.
    for algo in setup.algorithms:
        for proto in setup.protocols:
            t = setup.estimate_us(algo, proto, nbytes)
            if best is None or t < best[0]:
                best = (t, algo, proto)
    if best is None:  # pragma: no cover - usable guarantees one pair
        raise _no_algorithm(setup)
    return best[1], best[2]


def _allreduce_us(setup: NcclSetup, nbytes: float) -> float:
    algo, proto = setup.choice(nbytes)
    prof = setup._profile
    cost = prof.allreduce_cost
    entry = cost.algos[algo][proto]
    n = prof.hardware.n_ranks
    hops = sum(cost.hop_penalty_us[t] for t in setup.link_transports)
    f_bw = 1.0
    if setup.n_shm:
        f_bw *= cost.bw_factor[_SHM]
    if setup.n_net:
        f_bw *= cost.bw_factor[_NET]
    if setup.max_nchannels is not None and setup.max_nchannels < cost.full_bw_min_channels:
        f_bw *= setup.max_nchannels / cost.full_bw_min_channels
    if (
        proto != "LL128"
        and setup.nthreads is not None
        and setup.nthreads < cost.full_bw_min_threads
    ):
        f_bw *= setup.nthreads / cost.full_bw_min_threads
    payload = max(0.0, nbytes - entry.S0_B)
    return entry.A_us + (2 * (n - 1) / n) * hops + payload / (1000.0 * entry.B_GBps * f_bw)


def _no_algorithm(setup: NcclSetup) -> NcclNoAlgorithmError:
    extra = ""
    if setup.env.get("NCCL_ALGO"):
        extra += f" NCCL_ALGO was set to {setup.env['NCCL_ALGO']}."
    if setup.env.get("NCCL_PROTO"):
        extra += f" NCCL_PROTO was set to {setup.env['NCCL_PROTO']}."
    return NcclNoAlgorithmError(
        "NCCL WARN Error : no algorithm/protocol available for function AllReduce with "
        f"datatype {_DATATYPE}.{extra}\n"
        "ncclInvalidUsage: This usually reflects invalid usage of NCCL library."
    )


# --------------------------------------------------------------------------------------------
# Resolution


def resolve_nccl(env: Mapping[str, str], profile: Profile) -> NcclSetup:
    """Resolve a trial's NCCL environment on a profile's node (docs/twin-model.md, *NCCL
    variables*, *All-reduce latency*).

    Only ``NCCL_*`` variables are read; anything else in ``env`` is ignored, so the whole
    process environment may be passed. An empty value counts as unset.

    Args:
        env: the environment the server process sees (after SGLang's own writes).
        profile: the hardware/model profile.

    Returns:
        The resolved setup.

    Raises:
        NcclInitError: ``NCCL_PROTO``/``NCCL_ALGO`` holds an unknown token or prefix, or a later
            entry without a ``func:`` prefix (communicator init fails with ``ncclInvalidUsage``).
        NcclForbiddenError: on a ``multicast_forbidden`` machine, ``NCCL_NVLS_ENABLE`` is not 0
            or ``NCCL_ALGO`` enables NVLS/NVLSTree.
    """
    nccl_env = {k: v for k, v in env.items() if k.startswith("NCCL_") and v != ""}
    warnings: list[str] = []
    hw = profile.hardware
    ch = profile.nccl_choice

    proto_set = parse_nccl_list(nccl_env.get("NCCL_PROTO"), "NCCL_PROTO", PROTOCOLS)
    algo_set = parse_nccl_list(nccl_env.get("NCCL_ALGO"), "NCCL_ALGO", ALGORITHMS)

    if proto_set is None:
        protocols = tuple(p for p in PROTOCOLS if p != "LL128" or ch.ll128_auto)
    else:
        protocols = tuple(p for p in PROTOCOLS if p in proto_set)
    ll128_risk = proto_set is not None and "LL128" in proto_set and not ch.ll128_auto
    if ll128_risk:
        warnings.append(
            "NCCL WARN LL128 enabled by NCCL_PROTO on a ring without NVLink: LL128 relies on "
            "128-byte store ordering the PCIe path does not guarantee (silent corruption risk)"
        )

    if hw.multicast_forbidden:
        _check_multicast(nccl_env, algo_set)

    available = _available_algorithms(profile)
    wanted = set(ALGORITHMS) if algo_set is None else algo_set
    algorithms = tuple(a for a in ALGORITHMS if a in wanted and a in available)
    if algo_set is not None and not algorithms:
        warnings.append(
            f"NCCL WARN NCCL_ALGO={nccl_env['NCCL_ALGO']} leaves no algorithm available for "
            "AllReduce on this node"
        )

    level = nccl_p2p_level(nccl_env, profile, warnings)
    level_rank = ch.path_rank(level)
    shm_disabled = nccl_int_var(nccl_env, ("NCCL_SHM_DISABLE",), warnings) == 1
    transports = []
    for path in hw.ring_link_paths:
        if hw.nvml_p2p_supported and ch.path_rank(path) <= level_rank:
            transports.append(_P2P)
        else:
            transports.append(_NET if shm_disabled else _SHM)
    if _NET in transports:
        warnings.append(
            "NCCL WARN NCCL_SHM_DISABLE=1 and P2P is off for some ring links: falling back to "
            "the network transport (sockets)"
        )
    hang = hw.p2p_broken and _P2P in transports

    limit = ch.max_channels_limit
    max_nch = nccl_int_var(nccl_env, ("NCCL_MAX_NCHANNELS", "NCCL_MAX_NRINGS"), warnings)
    if max_nch is not None:
        max_nch = min(max(max_nch, 1), limit)
    min_nch = nccl_int_var(nccl_env, ("NCCL_MIN_NCHANNELS", "NCCL_MIN_NRINGS"), warnings)
    if min_nch is not None:
        min_nch = min(max(min_nch, 0), limit)
    nthreads = _nthreads(nccl_env, profile, warnings)

    detected = ch.detected_with_graph_file if "NCCL_GRAPH_FILE" in nccl_env else ch.detected
    nch = detected.nchannels
    if max_nch is not None:
        nch = min(nch, max_nch)
    if ch.choice_uses_min_channels and min_nch is not None:
        nch = max(nch, min_nch)
    nch = max(nch, 1)

    return NcclSetup(
        env=dict(sorted(nccl_env.items())),
        protocols=protocols,
        algorithms=algorithms,
        p2p_level=level,
        link_transports=tuple(transports),
        choice_bw_GBps=detected.bw_GBps,
        choice_nchannels=nch,
        max_nchannels=max_nch,
        min_nchannels=min_nch,
        nthreads=nthreads,
        warnings=tuple(warnings),
        ll128_risk=ll128_risk,
        hang=hang,
        _profile=profile,
    )


def parse_nccl_list(value: str | None, var: str, names: tuple[str, ...]) -> frozenset[str] | None:
    """NCCL's ``parseList`` restricted to AllReduce: the enabled names, or None when unset.

    Tokens are split the way ``strtok`` splits them (empty tokens vanish); names and prefixes
    compare case-insensitively; a later entry applying to AllReduce overrides an earlier one.
    """
    if value is None:
        return None
    lower = {n.lower(): n for n in names}
    functions = {f.lower() for f in _FUNCTIONS}
    result: frozenset[str] | None = None
    entries = [e for e in value.split(";") if e]
    for i, entry in enumerate(entries):
        parts = [p for p in entry.split(":") if p]
        if not parts:
            continue
        if len(parts) == 1:
            if i != 0:
                raise _init_error(
                    f'All entries except the first must have a prefix: "{value}"', var, value
                )
            prefix, elems = None, parts[0]
        else:
            prefix, elems = parts[0], parts[1]
            if prefix.lower() not in functions:
                raise _init_error(
                    f'Unrecognized prefix token "{prefix}" when parsing "{value}"', var, value
                )
        exclude = elems.startswith("^")
        if exclude:
            elems = elems[1:]
        chosen: set[str] = set()
        for token in (t for t in elems.split(",") if t):
            name = lower.get(token.lower())
            if name is None:
                raise _init_error(
                    f'Unrecognized element token "{token}" when parsing "{value}"', var, value
                )
            chosen.add(name)
        if prefix is None or prefix.lower() == "allreduce":
            result = frozenset(set(names) - chosen) if exclude else frozenset(chosen)
    return result


def _init_error(detail: str, var: str, value: str) -> NcclInitError:
    return NcclInitError(
        f"NCCL WARN {detail}\n"
        f"NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details) "
        f"[{var}={value}]\nncclInvalidUsage: This usually reflects invalid usage of NCCL library."
    )


def _check_multicast(env: Mapping[str, str], algo_set: frozenset[str] | None) -> None:
    nvls_enable = env.get("NCCL_NVLS_ENABLE")
    if nvls_enable is not None and nvls_enable != "0":
        raise NcclForbiddenError(
            f"NCCL_NVLS_ENABLE={nvls_enable} is forbidden on this machine: NVLink multicast "
            "must stay off (profile hardware.multicast_forbidden); use NCCL_NVLS_ENABLE=0"
        )
    nvls = sorted((algo_set or frozenset()) & {"NVLS", "NVLSTree"})
    if nvls:
        raise NcclForbiddenError(
            f"NCCL_ALGO={env['NCCL_ALGO']} enables {', '.join(nvls)}, which is forbidden on this "
            "machine: NVLink multicast must stay off (profile hardware.multicast_forbidden)"
        )


def _available_algorithms(profile: Profile) -> frozenset[str]:
    """AllReduce algorithms that exist on this node and have constants in the profile."""
    hw = profile.hardware
    exists = {"Ring", "Tree"}
    if hw.nvls_available:
        exists.add("NVLS")  # NVLSTree needs several nodes; PAT never runs AllReduce.
    if hw.collnet_available:
        exists.update(("CollNetDirect", "CollNetChain"))
    costed = set(profile.allreduce_cost.algos)
    return frozenset(exists & costed)


def nccl_p2p_level(env: Mapping[str, str], profile: Profile, warnings: list[str]) -> str:
    ch = profile.nccl_choice
    disable = env.get("NCCL_P2P_DISABLE")
    if disable is not None and _strtol(disable)[0] == 1:  # strtol(str, NULL, 0) == 1
        return ch.path_order[0]
    value = env.get("NCCL_P2P_LEVEL")
    if value is None:
        return ch.default_p2p_level
    if value in ch.path_order:
        return value
    if value[:1].isdigit():  # legacy integer (NCCL: first char a digit, then strtol base 0)
        legacy = ch.legacy_levels
        return legacy[min(_strtol(value)[0], len(legacy) - 1)]
    warnings.append(
        f"NCCL INFO NCCL_P2P_LEVEL={value} is not a recognised level "
        f"({', '.join(ch.path_order)}, case-sensitive): ignored, using {ch.default_p2p_level}"
    )
    return ch.default_p2p_level


def nccl_int_var(
    env: Mapping[str, str], names: tuple[str, ...], warnings: list[str]
) -> int | None:
    """The first set variable of ``names`` parsed as an NCCL integer parameter.

    NCCL reads integer parameters with ``strtoll(str, &end, 0)`` and keeps its default when the
    whole string is not a number (``Invalid value ... using default``): decimal, ``0x`` hex and
    leading-``0`` octal are accepted.
    """
    for name in names:
        if name in env:
            text = env[name]
            value, used = _strtol(text)
            if used == 0 or used != len(text):
                warnings.append(f"NCCL WARN Invalid value {text} for {name}, using default")
                return None
            return value
    return None


def _strtol(text: str) -> tuple[int, int]:
    """C ``strtol(text, &end, 0)``: the value of the longest numeric prefix, and its length.

    Leading whitespace and a sign are allowed; ``0x``/``0X`` means hex and a leading ``0``
    octal. ``(0, 0)`` when there is no number at all.
    """
    i = 0
    while i < len(text) and text[i] in " \t\n\v\f\r":
        i += 1
    sign = 1
    if i < len(text) and text[i] in "+-":
        sign = -1 if text[i] == "-" else 1
        i += 1
    base, digits = 10, "0123456789"
    hexdigits = "0123456789abcdef"
    if text[i : i + 2].lower() == "0x" and i + 2 < len(text) and text[i + 2].lower() in hexdigits:
        base, digits, i = 16, hexdigits, i + 2
    elif text[i : i + 1] == "0":
        base, digits = 8, "01234567"
    start = i
    while i < len(text) and text[i].lower() in digits:
        i += 1
    if i == start:
        return 0, 0
    return sign * int(text[start:i], base), i


def _nthreads(env: Mapping[str, str], profile: Profile, warnings: list[str]) -> int | None:
    """``getNthreads``: a non-multiple of 32 becomes max, then clamp to [min, max]."""
    lim = profile.nccl_choice.nthreads
    nt = nccl_int_var(env, ("NCCL_NTHREADS",), warnings)
    if nt is None or nt <= 0:
        return None
    if nt % lim.multiple != 0:
        warnings.append(
            f"NCCL INFO Invalid NCCL_NTHREADS {nt} (must be a multiple of {lim.multiple})"
        )
        return lim.max
    if nt > lim.max:
        warnings.append(f"NCCL INFO Invalid NCCL_NTHREADS {nt} (maximum {lim.max}).")
        return lim.max
    if nt < lim.min:
        warnings.append(f"NCCL INFO Invalid NCCL_NTHREADS {nt} (minimum {lim.min}).")
        return lim.min
    return nt
