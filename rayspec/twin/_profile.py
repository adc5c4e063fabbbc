"""Hardware/model profiles of the twin: every constant of the performance model, read from YAML.

A profile is a tree of frozen dataclasses mirroring docs/twin-model.md, *Profiles* (the
reference constants). :func:`load_profile` reads a built-in profile by name (the file stem in
``rayspec/twin/profiles/``) or any YAML file of the same schema. Reading is strict: a missing,
unknown or mistyped key raises :class:`ProfileError` naming the dotted key.

Example::

    profile = load_profile("kimi-k2.5-tp8-pcie")
    profile.forward.C0_ms          # 8.255
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Mapping
from importlib import resources
from types import MappingProxyType
from typing import Any

from rayspec._text import one_line
from rayspec.twin._errors import ProfileError
from rayspec.twin._profile_text import parse_yaml
from rayspec.twin._profile_text import read_profile_file
from rayspec.twin._profile_text import show

__all__ = [
    "AcceptanceProfile",
    "AllreduceCostProfile",
    "CostEntry",
    "DetectedBandwidth",
    "DrafterProfile",
    "ForwardProfile",
    "HardwareProfile",
    "ModelProfile",
    "MoeShape",
    "NcclChoiceProfile",
    "NoiseProfile",
    "NthreadsLimits",
    "Profile",
    "SpeculativeProfile",
    "TreeBandwidth",
    "UncalibratedProfile",
    "available_profiles",
    "load_profile",
]


_PROFILE_PACKAGE = "rayspec.twin"
_PROFILE_DIR = "profiles"
_ALGOS_WITH_COSTS = ("Ring", "Tree")
_PROTOCOLS = ("LL", "LL128", "Simple")
_TRANSPORTS = ("P2P", "SHM", "NET")
_ACCEPTANCE_KINDS = ("geometric", "flat", "per_depth")


@dataclasses.dataclass(frozen=True)
class HardwareProfile:
    """The node: ranks, the ring's link path types and what the platform allows (*The reference
    node*).

    ``multicast_forbidden`` marks machines where NVLink multicast must stay off (*NCCL
    variables*): the twin then rejects ``NCCL_NVLS_ENABLE`` other than 0 and any NVLS/NVLSTree in
    ``NCCL_ALGO``.
    """

    n_ranks: int
    ring_link_paths: tuple[str, ...]
    nvml_p2p_supported: bool
    p2p_broken: bool
    nvls_available: bool
    collnet_available: bool
    multicast_forbidden: bool


@dataclasses.dataclass(frozen=True)
class DetectedBandwidth:
    """NCCL's detected per-channel bandwidth and channel count (step A of *All-reduce latency*)."""

    bw_GBps: float
    nchannels: int


@dataclasses.dataclass(frozen=True)
class NthreadsLimits:
    """``getNthreads`` clamping of ``NCCL_NTHREADS``."""

    min: int
    max: int
    multiple: int


@dataclasses.dataclass(frozen=True)
class TreeBandwidth:
    """Tree bandwidth factors of NCCL's estimate (step A)."""

    base: float
    LL_div: float
    LL128_mul: float
    alg_mul: float


@dataclasses.dataclass(frozen=True)
class NcclChoiceProfile:
    """NCCL's internal cost model, used only to predict which (algo, proto) it picks (step A)."""

    link_class: str
    default_p2p_level: str
    path_order: tuple[str, ...]
    legacy_levels: tuple[str, ...]
    ll128_auto: bool
    choice_uses_min_channels: bool
    detected: DetectedBandwidth
    detected_with_graph_file: DetectedBandwidth
    max_channels_limit: int
    nthreads: NthreadsLimits
    base_lat_us: Mapping[str, Mapping[str, float]]
    hw_lat_us: Mapping[str, Mapping[str, float]]
    ll_max_bw_GBps: float
    ll128_per_channel_bw_GBps: float
    ll128_bw_factor: float
    ring_ll_bw_factor: float
    tree_bw: TreeBandwidth

    def path_rank(self, path: str) -> int:
        """Position of a path type in NCCL's order (``LOC`` is 0)."""
        return self.path_order.index(path)


@dataclasses.dataclass(frozen=True)
class CostEntry:
    """Real cost of one (algo, proto) on an all-P2P ring: ``A + max(0, S - S0) / B`` (step B)."""

    A_us: float
    S0_B: float
    B_GBps: float


@dataclasses.dataclass(frozen=True)
class AllreduceCostProfile:
    """What an all-reduce really costs on the box (step B)."""

    algos: Mapping[str, Mapping[str, CostEntry]]
    hop_penalty_us: Mapping[str, float]
    bw_factor: Mapping[str, float]
    full_bw_min_channels: int
    full_bw_min_threads: int


@dataclasses.dataclass(frozen=True)
class MoeShape:
    """Routed experts of a MoE target."""

    n_experts: int
    experts_per_token: int


@dataclasses.dataclass(frozen=True)
class ModelProfile:
    """Shape of the target model (*The reference node*, *Forward pass*). ``moe`` is None for a
    dense model."""

    architecture: str
    hidden: int
    layers: int
    vocab: int
    act_bytes: int
    collectives_per_forward: int
    moe: MoeShape | None
    kv_bytes_per_token_layer: float
    kv_bw_bytes_per_ms: float
    calib_context: float

    @property
    def token_bytes(self) -> int:
        """All-reduce payload of one token's activation (14,336 B on the reference)."""
        return self.hidden * self.act_bytes


@dataclasses.dataclass(frozen=True)
class ForwardProfile:
    """Forward-pass constants (*Forward pass*), in ms."""

    C0_ms: float
    W0_ms: float
    c_e_ms: float
    p_tok_ms: float
    flop_tok_ms: float
    # [est] launch overhead of one target forward run eagerly (a decode batch above
    # --cuda-graph-max-bs, or graphs off); absent: 0, eager costs what a graph does.
    eager_ms: float = 0.0
    # A model variant (*Model variants*): the token counts a graphed forward (a decode or a
    # verify) is captured and its kernels tuned for, ascending; one of T tokens costs as the
    # next size up (T itself beyond the largest, and eagerly). Absent: every T costs its own.
    graph_token_sizes: tuple[int, ...] = ()

    def graph_tokens(self, tokens: int) -> int:
        """The token count a graphed forward of ``tokens`` tokens runs at."""
        return next((s for s in self.graph_token_sizes if s >= tokens), tokens)


@dataclasses.dataclass(frozen=True)
class SpeculativeProfile:
    """EAGLE-3 verify and draft overheads (*EAGLE-3*).

    ``F_spec_no_overlap_ms``: F_spec with the speculative overlap scheduler off (topk 1,
    ``--disable-overlap-schedule``): the scheduler's CPU work is no longer hidden behind the
    GPU's. [est] everywhere: no field measurement; absent, it equals ``F_spec_ms``.

    ``adaptive_ms``: what ``--speculative-adaptive`` adds to every decode iteration, plain
    decoding (a tier at 0 steps) included: the controller reads each request's accepted drafts
    back to the host and updates its tier's EMA before the next batch is planned. [est]: no
    field measurement; absent, 0 (adaptive mode costs nothing).
    """

    F_spec_ms: float
    D0_ms: float
    d_step_ms: float
    draft_collectives_per_step: int
    F_spec_no_overlap_ms: float | None = None
    adaptive_ms: float = 0.0
    # [est] launch overhead of one draft step run eagerly; absent: 0.
    draft_eager_ms: float = 0.0
    # Model variants (*Model variants*), absent: 0. Each draft step of a topk-m tree costs
    # ``topk_step_ms (m**topk_power - 1)`` more (0 for a chain); a tree's verify (topk > 1)
    # costs ``tree_verify_ms_per_token`` more per verified token than a chain's.
    topk_step_ms: float = 0.0
    topk_power: float = 1.0
    tree_verify_ms_per_token: float = 0.0

    def f_spec_ms(self, overlap: bool) -> float:
        if overlap or self.F_spec_no_overlap_ms is None:
            return self.F_spec_ms
        return self.F_spec_no_overlap_ms


@dataclasses.dataclass(frozen=True)
class AcceptanceProfile:
    """Conditional acceptance by depth, before the ``mult`` scaling and the cap (*EAGLE-3*).

    ``kind`` is ``"geometric"`` (``a1 * rho**(j-1)``), ``"flat"`` (``a``) or ``"per_depth"``
    (``per_depth[j-1]``, the last value repeating).
    """

    kind: str
    a1: float = 0.0
    rho: float = 0.0
    a: float = 0.0
    per_depth: tuple[float, ...] = ()

    def base(self, depth: int) -> float:
        """Acceptance at ``depth`` (1-based) for ``mult = 1``, uncapped."""
        if self.kind == "geometric":
            return self.a1 * self.rho ** (depth - 1)
        if self.kind == "flat":
            return self.a
        return self.per_depth[min(depth, len(self.per_depth)) - 1]


@dataclasses.dataclass(frozen=True)
class DrafterProfile:
    """The drafter's acceptance model (*EAGLE-3*).

    ``category_mult``: a request's acceptance multiplier by its prompt's category (*Prompt
    categories*), on top of its noise draw; a category not named (``"default"`` among them)
    keeps 1.
    """

    acceptance: AcceptanceProfile
    a_cap: float
    tree_theta: float
    category_mult: Mapping[str, float] = dataclasses.field(
        default_factory=lambda: MappingProxyType({})
    )

    def mult_for(self, category: str | None) -> float:
        """The acceptance multiplier of a request of ``category`` (1 when not named)."""
        return self.category_mult.get(category, 1.0) if category is not None else 1.0


@dataclasses.dataclass(frozen=True)
class NoiseProfile:
    """Run-to-run noise (*Noise*). All sigmas 0 means deterministic."""

    sigma_time: float
    sigma_accept: float
    accept_floor: float
    sigma_start: float

    @classmethod
    def off(cls) -> NoiseProfile:
        """No noise at all (``noise: off`` in YAML)."""
        return cls(sigma_time=0.0, sigma_accept=0.0, accept_floor=0.0, sigma_start=0.0)

    @property
    def enabled(self) -> bool:
        return any((self.sigma_time, self.sigma_accept, self.sigma_start))


@dataclasses.dataclass(frozen=True)
class UncalibratedProfile:
    """UNCALIBRATED placeholders for what the field measurements do not cover (*Open points*)."""

    prefill_base_ms: float
    prefill_ms_per_token: float
    startup_s: float
    cuda_graph_capture_s: float


@dataclasses.dataclass(frozen=True)
class Profile:
    """One hardware/model profile: every constant the twin's performance model uses."""

    name: str
    hardware: HardwareProfile
    nccl_choice: NcclChoiceProfile
    allreduce_cost: AllreduceCostProfile
    model: ModelProfile
    forward: ForwardProfile
    speculative: SpeculativeProfile
    drafter: DrafterProfile
    noise: NoiseProfile
    uncalibrated: UncalibratedProfile


# --------------------------------------------------------------------------------------------
# Loading


def available_profiles() -> list[str]:
    """Names of the built-in profiles (YAML file stems in ``rayspec/twin/profiles/``), sorted."""
    root = resources.files(_PROFILE_PACKAGE).joinpath(_PROFILE_DIR)
    return sorted(
        entry.name.removesuffix(".yaml")
        for entry in root.iterdir()
        if entry.is_file() and entry.name.endswith(".yaml")
    )


def load_profile(name_or_path: str) -> Profile:
    """Load a built-in profile by name, or a profile YAML by path.

    Args:
        name_or_path: a built-in name such as ``"kimi-k2.5-tp8-pcie"``, or a path to a YAML file.

    Returns:
        The validated profile.

    Raises:
        ProfileError: the name is unknown, the file is missing or unreadable, or a key is
            missing, unknown or of the wrong type (the message names the dotted key).
    """
    if name_or_path in available_profiles():
        return _load_builtin(name_or_path)
    shown = show(name_or_path)
    if not os.path.isfile(name_or_path):
        raise ProfileError(
            f"unknown profile {shown}: not a built-in name "
            f"({', '.join(available_profiles())}) and no such file"
        )
    text = read_profile_file(name_or_path)
    return _parse(text, f"profile file {shown}")


@functools.cache
def _load_builtin(name: str) -> Profile:
    # Profiles are deeply immutable (frozen dataclasses, read-only mappings), so one shared
    # instance per built-in name is safe.
    ref = resources.files(_PROFILE_PACKAGE).joinpath(_PROFILE_DIR, f"{name}.yaml")
    return _parse(ref.read_text(encoding="utf-8"), f"built-in profile {name!r}")


def _parse(text: str, source: str) -> Profile:
    data = parse_yaml(text, source)
    try:
        return profile_from_dict(data, source=source)
    except RecursionError:
        raise ProfileError(f"{source}: nested too deeply") from None


def profile_from_dict(data: Any, *, source: str = "profile") -> Profile:
    """Build a :class:`Profile` from parsed YAML (strict: see :func:`load_profile`)."""
    root = _Node(data, "", source)
    profile = Profile(
        name=root.get_str("profile"),
        hardware=_hardware(root.node("hardware")),
        nccl_choice=_nccl_choice(root.node("nccl_choice")),
        allreduce_cost=_allreduce_cost(root.node("allreduce_cost")),
        model=_model(root.node("model")),
        forward=_forward(root.node("forward")),
        speculative=_speculative(root.node("speculative")),
        drafter=_drafter(root.node("drafter")),
        noise=_noise(root),
        uncalibrated=_uncalibrated(root.node("uncalibrated")),
    )
    root.done()
    _cross_check(profile, source)
    return profile


class _Node:
    """A mapping being read: remembers its dotted path and which keys were consumed."""

    def __init__(self, data: Any, path: str, source: str) -> None:
        if not isinstance(data, Mapping):
            where = path or "top level"
            raise ProfileError(f"{source}: {where} must be a mapping, got {_tname(data)}")
        self.data = data
        self.path = path
        self.source = source
        self.used: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def error(self, name: str, message: str) -> ProfileError:
        # One line, bounded: a key or value is whatever the file held (a 10^8-element alias
        # expansion, a newline).
        return ProfileError(one_line(f"{self.source}: key {show(self.key(name))} {message}"))

    def raw(self, name: str) -> Any:
        self.used.add(name)
        if name not in self.data:
            raise self.error(name, "is missing")
        return self.data[name]

    def has(self, name: str) -> bool:
        return name in self.data

    def node(self, name: str) -> _Node:
        value = self.raw(name)
        if not isinstance(value, Mapping):
            raise self.error(name, f"must be a mapping, got {_tname(value)}")
        return _Node(value, self.key(name), self.source)

    def get_float(self, name: str, *, positive: bool = False, min_value: float = 0.0) -> float:
        return _as_float(self.raw(name), self, name, positive=positive, min_value=min_value)

    def get_int(self, name: str, *, min_value: int = 0) -> int:
        value = self.raw(name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(name, f"must be an integer, got {_tname(value)} {show(value)}")
        if value < min_value:
            raise self.error(name, f"must be >= {min_value}, got {value}")
        return value

    def get_bool(self, name: str) -> bool:
        value = self.raw(name)
        if not isinstance(value, bool):
            raise self.error(name, f"must be true or false, got {_tname(value)} {show(value)}")
        return value

    def get_str(self, name: str) -> str:
        value = self.raw(name)
        if not isinstance(value, str) or not value:
            raise self.error(
                name, f"must be a non-empty string, got {_tname(value)} {show(value)}"
            )
        return value

    def get_str_list(self, name: str) -> tuple[str, ...]:
        value = self.raw(name)
        if not isinstance(value, list) or not value:
            raise self.error(name, f"must be a non-empty list of strings, got {show(value)}")
        for item in value:
            if not isinstance(item, str):
                raise self.error(name, f"must hold strings only, got {show(item)}")
        return tuple(value)

    def get_float_map(self, name: str, keys: tuple[str, ...]) -> Mapping[str, float]:
        sub = self.node(name)
        out = {k: sub.get_float(k) for k in keys}
        sub.done()
        return MappingProxyType(out)

    def done(self) -> None:
        unknown = sorted(str(k) for k in self.data if k not in self.used)
        if unknown:
            raise self.error(unknown[0], "is not a known key")


def _as_float(
    value: Any, node: _Node, name: str, *, positive: bool = False, min_value: float = 0.0
) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise node.error(name, f"must be a number, got {_tname(value)} {show(value)}")
    try:
        result = float(value)
    except OverflowError:  # an integer past a float's range (YAML reads 1e400 as inf)
        raise node.error(name, "must be finite, got an integer too large for a float") from None
    if not math.isfinite(result):
        raise node.error(name, f"must be finite, got {show(value)}")
    if positive and result <= 0:
        raise node.error(name, f"must be > 0, got {show(value)}")
    if result < min_value:
        raise node.error(name, f"must be >= {min_value}, got {show(value)}")
    return result


def _tname(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _hardware(node: _Node) -> HardwareProfile:
    out = HardwareProfile(
        n_ranks=node.get_int("n_ranks", min_value=1),
        ring_link_paths=node.get_str_list("ring_link_paths"),
        nvml_p2p_supported=node.get_bool("nvml_p2p_supported"),
        p2p_broken=node.get_bool("p2p_broken"),
        nvls_available=node.get_bool("nvls_available"),
        collnet_available=node.get_bool("collnet_available"),
        multicast_forbidden=node.get_bool("multicast_forbidden"),
    )
    node.done()
    return out


def _detected(node: _Node) -> DetectedBandwidth:
    out = DetectedBandwidth(
        bw_GBps=node.get_float("bw_GBps", positive=True),
        nchannels=node.get_int("nchannels", min_value=1),
    )
    node.done()
    return out


def _latency_table(node: _Node, name: str) -> Mapping[str, Mapping[str, float]]:
    # Only Ring and Tree are modelled (the AllReduce algorithms of a single PCIe node, *NCCL
    # variables*).
    sub = node.node(name)
    table = {algo: sub.get_float_map(algo, _PROTOCOLS) for algo in _ALGOS_WITH_COSTS}
    sub.done()
    return MappingProxyType(table)


def _nccl_choice(node: _Node) -> NcclChoiceProfile:
    nt = node.node("nthreads")
    nthreads = NthreadsLimits(
        min=nt.get_int("min", min_value=1),
        max=nt.get_int("max", min_value=1),
        multiple=nt.get_int("multiple", min_value=1),
    )
    nt.done()
    tb = node.node("tree_bw")
    tree_bw = TreeBandwidth(
        base=tb.get_float("base", positive=True),
        LL_div=tb.get_float("LL_div", positive=True),
        LL128_mul=tb.get_float("LL128_mul", positive=True),
        alg_mul=tb.get_float("alg_mul", positive=True),
    )
    tb.done()
    out = NcclChoiceProfile(
        link_class=node.get_str("link_class"),
        default_p2p_level=node.get_str("default_p2p_level"),
        path_order=node.get_str_list("path_order"),
        legacy_levels=node.get_str_list("legacy_levels"),
        ll128_auto=node.get_bool("ll128_auto"),
        choice_uses_min_channels=node.get_bool("choice_uses_min_channels"),
        detected=_detected(node.node("detected")),
        detected_with_graph_file=_detected(node.node("detected_with_graph_file")),
        max_channels_limit=node.get_int("max_channels_limit", min_value=1),
        nthreads=nthreads,
        base_lat_us=_latency_table(node, "base_lat_us"),
        hw_lat_us=_latency_table(node, "hw_lat_us"),
        ll_max_bw_GBps=node.get_float("ll_max_bw_GBps", positive=True),
        ll128_per_channel_bw_GBps=node.get_float("ll128_per_channel_bw_GBps", positive=True),
        ll128_bw_factor=node.get_float("ll128_bw_factor", positive=True),
        ring_ll_bw_factor=node.get_float("ring_ll_bw_factor", positive=True),
        tree_bw=tree_bw,
    )
    node.done()
    for key, level in (("default_p2p_level", out.default_p2p_level),):
        if level not in out.path_order:
            raise node.error(key, f"must be one of nccl_choice.path_order, got {show(level)}")
    for level in out.legacy_levels:
        if level not in out.path_order:
            raise node.error("legacy_levels", f"holds {show(level)}, which is not in path_order")
    return out


def _allreduce_cost(node: _Node) -> AllreduceCostProfile:
    algos_node = node.node("algos")
    algos: dict[str, Mapping[str, CostEntry]] = {}
    for algo in _ALGOS_WITH_COSTS:
        per_proto = algos_node.node(algo)
        entries: dict[str, CostEntry] = {}
        for proto in _PROTOCOLS:
            e = per_proto.node(proto)
            entries[proto] = CostEntry(
                A_us=e.get_float("A_us"),
                S0_B=e.get_float("S0_B"),
                B_GBps=e.get_float("B_GBps", positive=True),
            )
            e.done()
        per_proto.done()
        algos[algo] = MappingProxyType(entries)
    algos_node.done()
    out = AllreduceCostProfile(
        algos=MappingProxyType(algos),
        hop_penalty_us=node.get_float_map("hop_penalty_us", _TRANSPORTS),
        bw_factor=node.get_float_map("bw_factor", ("SHM", "NET")),
        full_bw_min_channels=node.get_int("full_bw_min_channels", min_value=1),
        full_bw_min_threads=node.get_int("full_bw_min_threads", min_value=1),
    )
    node.done()
    return out


def _model(node: _Node) -> ModelProfile:
    moe: MoeShape | None = None
    if node.raw("moe") is not None:
        m = node.node("moe")
        moe = MoeShape(
            n_experts=m.get_int("n_experts", min_value=1),
            experts_per_token=m.get_int("experts_per_token", min_value=1),
        )
        m.done()
        if moe.experts_per_token > moe.n_experts:
            raise node.error("moe.experts_per_token", "must not exceed moe.n_experts")
    out = ModelProfile(
        architecture=node.get_str("architecture"),
        hidden=node.get_int("hidden", min_value=1),
        layers=node.get_int("layers", min_value=1),
        vocab=node.get_int("vocab", min_value=1),
        act_bytes=node.get_int("act_bytes", min_value=1),
        collectives_per_forward=node.get_int("collectives_per_forward"),
        moe=moe,
        kv_bytes_per_token_layer=node.get_float("kv_bytes_per_token_layer"),
        kv_bw_bytes_per_ms=node.get_float("kv_bw_bytes_per_ms", positive=True),
        calib_context=node.get_float("calib_context"),
    )
    node.done()
    return out


def _forward(node: _Node) -> ForwardProfile:
    out = ForwardProfile(
        C0_ms=node.get_float("C0_ms"),
        W0_ms=node.get_float("W0_ms"),
        c_e_ms=node.get_float("c_e_ms"),
        p_tok_ms=node.get_float("p_tok_ms"),
        flop_tok_ms=node.get_float("flop_tok_ms"),
        eager_ms=node.get_float("eager_ms") if node.has("eager_ms") else 0.0,
        graph_token_sizes=(
            _sizes(node, "graph_token_sizes") if node.has("graph_token_sizes") else ()
        ),
    )
    node.done()
    if out.W0_ms > out.C0_ms:
        raise node.error("W0_ms", f"must not exceed forward.C0_ms ({out.C0_ms})")
    return out


def _speculative(node: _Node) -> SpeculativeProfile:
    out = SpeculativeProfile(
        F_spec_ms=node.get_float("F_spec_ms"),
        D0_ms=node.get_float("D0_ms"),
        d_step_ms=node.get_float("d_step_ms"),
        draft_collectives_per_step=node.get_int("draft_collectives_per_step"),
        F_spec_no_overlap_ms=(
            node.get_float("F_spec_no_overlap_ms") if node.has("F_spec_no_overlap_ms") else None
        ),
        adaptive_ms=node.get_float("adaptive_ms") if node.has("adaptive_ms") else 0.0,
        draft_eager_ms=node.get_float("draft_eager_ms") if node.has("draft_eager_ms") else 0.0,
        topk_step_ms=node.get_float("topk_step_ms") if node.has("topk_step_ms") else 0.0,
        topk_power=node.get_float("topk_power", min_value=1.0) if node.has("topk_power") else 1.0,
        tree_verify_ms_per_token=(
            node.get_float("tree_verify_ms_per_token")
            if node.has("tree_verify_ms_per_token")
            else 0.0
        ),
    )
    node.done()
    return out


def _sizes(node: _Node, name: str) -> tuple[int, ...]:
    """A non-empty, strictly ascending list of positive integers (token counts)."""
    value = node.raw(name)
    if not isinstance(value, list) or not value:
        raise node.error(name, f"must be a non-empty list of token counts, got {value!r}")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or item < 1:
            raise node.error(name, f"must hold integers >= 1 only, got {item!r}")
    if any(b <= a for a, b in zip(value, value[1:], strict=False)):
        raise node.error(name, f"must be strictly ascending, got {value!r}")
    return tuple(value)


def _probability(node: _Node, name: str, value: Any) -> float:
    result = _as_float(value, node, name)
    if result > 1.0:
        raise node.error(name, f"must be a probability in [0, 1], got {show(value)}")
    return result


def _acceptance(node: _Node) -> AcceptanceProfile:
    kind = node.get_str("kind")
    if kind == "geometric":
        out = AcceptanceProfile(
            kind=kind, a1=_probability(node, "a1", node.raw("a1")), rho=node.get_float("rho")
        )
    elif kind == "flat":
        out = AcceptanceProfile(kind=kind, a=_probability(node, "a", node.raw("a")))
    elif kind == "per_depth":
        values = node.raw("a")
        if not isinstance(values, list) or not values:
            raise node.error(
                "a", f"must be a non-empty list for kind per_depth, got {show(values)}"
            )
        out = AcceptanceProfile(
            kind=kind, per_depth=tuple(_probability(node, "a", v) for v in values)
        )
    else:
        raise node.error(
            "kind", f"must be one of {', '.join(_ACCEPTANCE_KINDS)}, got {show(kind)}"
        )
    node.done()
    return out


def _category_mult(node: _Node) -> Mapping[str, float]:
    """``drafter.category_mult``: category -> a positive multiplier (absent: none)."""
    if not node.has("category_mult"):
        return MappingProxyType({})
    sub = node.node("category_mult")
    out = {str(k): sub.get_float(str(k), positive=True) for k in sub.data}
    sub.done()
    return MappingProxyType(out)


def _drafter(node: _Node) -> DrafterProfile:
    out = DrafterProfile(
        acceptance=_acceptance(node.node("acceptance")),
        a_cap=_probability(node, "a_cap", node.raw("a_cap")),
        tree_theta=_probability(node, "tree_theta", node.raw("tree_theta")),
        category_mult=_category_mult(node),
    )
    node.done()
    return out


def _noise(root: _Node) -> NoiseProfile:
    if root.raw("noise") is False:  # YAML `noise: off`
        return NoiseProfile.off()
    node = root.node("noise")
    out = NoiseProfile(
        sigma_time=node.get_float("sigma_time"),
        sigma_accept=node.get_float("sigma_accept"),
        accept_floor=node.get_float("accept_floor"),
        sigma_start=node.get_float("sigma_start"),
    )
    node.done()
    return out


def _uncalibrated(node: _Node) -> UncalibratedProfile:
    out = UncalibratedProfile(
        prefill_base_ms=node.get_float("prefill_base_ms"),
        prefill_ms_per_token=node.get_float("prefill_ms_per_token"),
        startup_s=node.get_float("startup_s"),
        cuda_graph_capture_s=node.get_float("cuda_graph_capture_s"),
    )
    node.done()
    return out


def _cross_check(profile: Profile, source: str) -> None:
    order = profile.nccl_choice.path_order
    for path in profile.hardware.ring_link_paths:
        if path not in order:
            raise ProfileError(
                f"{source}: key 'hardware.ring_link_paths' holds {show(path)}, which is not in "
                f"nccl_choice.path_order ({', '.join(order)})"
            )
    if len(profile.hardware.ring_link_paths) != profile.hardware.n_ranks:
        raise ProfileError(
            f"{source}: key 'hardware.ring_link_paths' must list one path per ring link "
            f"(n_ranks = {profile.hardware.n_ranks}), got {len(profile.hardware.ring_link_paths)}"
        )
