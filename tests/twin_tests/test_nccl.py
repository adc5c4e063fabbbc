"""NCCL resolution (docs/twin-model.md): parsing, step A choice, step B cost, the sensitivity
table."""

from __future__ import annotations

import dataclasses

import pytest

from rayspec._exceptions import FailureReason
from rayspec._exceptions import RayspecError
from rayspec._types import SpecSettings
from rayspec.testing import FIELD_TUNED_NCCL
from rayspec.twin._errors import NcclForbiddenError
from rayspec.twin._errors import NcclInitError
from rayspec.twin._errors import NcclNoAlgorithmError
from rayspec.twin._model import PerfModel
from rayspec.twin._nccl import NcclSetup
from rayspec.twin._nccl import resolve_nccl
from rayspec.twin._profile import Profile
from rayspec.twin._profile import load_profile

PROFILE = load_profile("kimi-k2.5-tp8-pcie")
SIZES = (14336, 43008, 86016)  # 14 / 43 / 86 KB: decode, verify of 3, verify of 6
TUNED = dict(FIELD_TUNED_NCCL)
SYS = {"NCCL_P2P_LEVEL": "SYS"}
LL_SYS = {"NCCL_PROTO": "LL", "NCCL_P2P_LEVEL": "SYS"}


def _setup(env: dict[str, str], profile: Profile = PROFILE) -> NcclSetup:
    return resolve_nccl(env, profile)


def _tok_s(setup: NcclSetup, steps: int | None) -> float:
    spec = None if steps is None else SpecSettings("EAGLE3", steps, 1, steps + 1)
    return PerfModel(PROFILE, setup, spec).expected_tok_s()


# The NCCL sensitivity table: env, pick at 14 KB, µs at 14/43/86 KB, base tok/s, k=2, k=5.
SENSITIVITY = [
    ("untuned", {}, ("Ring", "Simple"), (61.1, 63.0, 65.7), (63.1, 75.9, 70.3)),
    ("P2P_LEVEL=SYS", SYS, ("Ring", "Simple"), (47.1, 48.2, 49.8), (71.0, 82.3, 76.3)),
    (
        "P2P_LEVEL=4",
        {"NCCL_P2P_LEVEL": "4"},
        ("Ring", "Simple"),
        (47.1, 48.2, 49.8),
        (71.0, 82.3, 76.3),
    ),
    (
        "P2P_LEVEL=sys ignored",
        {"NCCL_P2P_LEVEL": "sys"},
        ("Ring", "Simple"),
        (61.1, 63.0, 65.7),
        (63.1, 75.9, 70.3),
    ),
    (
        "P2P_LEVEL=PHB",
        {"NCCL_P2P_LEVEL": "PHB"},
        ("Ring", "Simple"),
        (50.8, 52.7, 55.4),
        (68.7, 80.2, 74.1),
    ),
    ("PROTO=LL", {"NCCL_PROTO": "LL"}, ("Ring", "LL"), (38.2, 38.2, 42.6), (77.0, 87.1, 79.4)),
    (
        "PROTO=LL PHB",
        {"NCCL_PROTO": "LL", "NCCL_P2P_LEVEL": "PHB"},
        ("Ring", "LL"),
        (27.9, 27.9, 32.3),
        (85.3, 92.9, 84.3),
    ),
    ("PROTO=LL SYS", LL_SYS, ("Ring", "LL"), (24.5, 24.5, 27.1), (88.6, 94.9, 86.9)),
    ("tuned six", TUNED, ("Ring", "LL"), (24.5, 24.5, 27.1), (88.6, 94.9, 86.9)),
    (
        "SYS + GRAPH_FILE",
        {**SYS, "NCCL_GRAPH_FILE": "/etc/nccl/graph.xml"},
        ("Ring", "LL"),
        (24.5, 24.5, 27.1),
        (88.6, 94.9, 86.9),
    ),
    (
        "PROTO=LL128 SYS",
        {"NCCL_PROTO": "LL128", **SYS},
        ("Ring", "LL128"),
        (33.6, 34.8, 36.6),
        (80.5, 89.0, 82.1),
    ),
    (
        "PROTO=^LL SYS",
        {"NCCL_PROTO": "^LL", **SYS},
        ("Ring", "LL128"),
        (33.6, 34.8, 49.8),
        (80.5, 89.0, 76.9),
    ),
    (
        "PROTO=Simple SYS",
        {"NCCL_PROTO": "Simple", **SYS},
        ("Ring", "Simple"),
        (47.1, 48.2, 49.8),
        (71.0, 82.3, 76.3),
    ),
    (
        "ALGO=Tree LL SYS",
        {"NCCL_ALGO": "Tree", **LL_SYS},
        ("Tree", "LL"),
        (26.0, 26.0, 31.3),
        (87.1, 94.0, 84.9),
    ),
    (
        "ALGO=Ring,NVLS LL SYS",
        {"NCCL_ALGO": "Ring,NVLS", **LL_SYS},
        ("Ring", "LL"),
        (24.5, 24.5, 27.1),
        (88.6, 94.9, 86.9),
    ),
    (
        "P2P_DISABLE=1 LL SYS",
        {"NCCL_P2P_DISABLE": "1", **LL_SYS},
        ("Ring", "LL"),
        (38.2, 38.2, 42.6),
        (77.0, 87.1, 79.4),
    ),
    (
        "SHM_DISABLE=1",
        {"NCCL_SHM_DISABLE": "1"},
        ("Ring", "Simple"),
        (217, 223, 231),
        (28.4, 41.4, 38.7),
    ),
    (
        "SHM_DISABLE=1 SYS LL",
        {"NCCL_SHM_DISABLE": "1", **LL_SYS},
        ("Ring", "LL"),
        (24.5, 24.5, 27.1),
        (88.6, 94.9, 86.9),
    ),
    (
        "tuned NTHREADS=64",
        {**TUNED, "NCCL_NTHREADS": "64"},
        ("Ring", "LL"),
        (24.5, 24.5, 29.8),
        (88.6, 94.9, 85.6),
    ),
    (
        "tuned MAX_NCHANNELS=1",
        {**TUNED, "NCCL_MAX_NCHANNELS": "1"},
        ("Ring", "LL"),
        (24.5, 24.5, 35.0),
        (88.6, 94.9, 83.3),
    ),
]


@pytest.mark.parametrize(
    ("env", "pick", "latency_us", "tok_s"),
    [row[1:] for row in SENSITIVITY],
    ids=[row[0] for row in SENSITIVITY],
)
def test_sensitivity_table(
    env: dict[str, str],
    pick: tuple[str, str],
    latency_us: tuple[float, float, float],
    tok_s: tuple[float, float, float],
) -> None:
    setup = _setup(env)
    assert setup.choice(SIZES[0]) == pick
    for size, expected in zip(SIZES, latency_us, strict=True):
        assert setup.allreduce_us(size) == pytest.approx(expected, rel=0.01)
    for steps, expected in zip((None, 2, 5), tok_s, strict=True):
        assert _tok_s(setup, steps) == pytest.approx(expected, rel=0.01)


def test_caret_ll_switches_to_simple_at_86_kb() -> None:
    setup = _setup({"NCCL_PROTO": "^LL", **SYS})
    assert [setup.choice(s) for s in SIZES] == [
        ("Ring", "LL128"),
        ("Ring", "LL128"),
        ("Ring", "Simple"),
    ]


# docs/twin-model.md, *Open points*: NCCL_MIN_NCHANNELS moves NCCL's pick
# (choice_uses_min_channels).
MIN_CHANNELS = [
    ("4", [("Tree", "Simple"), ("Ring", "Simple"), ("Ring", "Simple")], (65.2, 76.0, 70.4)),
    ("8", [("Ring", "LL"), ("Tree", "Simple"), ("Ring", "Simple")], (77.0, 77.6, 71.2)),
    ("16", [("Ring", "LL"), ("Ring", "LL"), ("Tree", "Simple")], (77.0, 87.1, 71.8)),
]


@pytest.mark.parametrize(("value", "picks", "tok_s"), MIN_CHANNELS)
def test_min_nchannels_moves_the_choice(
    value: str, picks: list[tuple[str, str]], tok_s: tuple[float, float, float]
) -> None:
    setup = _setup({"NCCL_MIN_NCHANNELS": value})
    assert [setup.choice(s) for s in SIZES] == picks
    for steps, expected in zip((None, 2, 5), tok_s, strict=True):
        assert _tok_s(setup, steps) == pytest.approx(expected, rel=0.01)


def test_min_nchannels_switch_off() -> None:
    profile = dataclasses.replace(
        PROFILE,
        nccl_choice=dataclasses.replace(PROFILE.nccl_choice, choice_uses_min_channels=False),
    )
    setup = _setup({"NCCL_MIN_NCHANNELS": "16"}, profile)
    assert setup.choice(SIZES[0]) == ("Ring", "Simple")
    assert setup.allreduce_us(SIZES[0]) == pytest.approx(61.14, abs=0.01)


def test_legacy_min_nrings() -> None:
    assert _setup({"NCCL_MIN_NRINGS": "8"}).choice(SIZES[0]) == ("Ring", "LL")
    # The new name wins over the legacy one.
    setup = _setup({"NCCL_MIN_NCHANNELS": "2", "NCCL_MIN_NRINGS": "8"})
    assert setup.choice(SIZES[0]) == ("Ring", "Simple")


# ---------------------------------------------------------------- step A and B arithmetic


def test_step_a_estimate_checks() -> None:
    setup = _setup({})
    s = 14336.0
    # Step A checks: Ring/LL = 20.6 + S/57, Ring/Simple = 88.2 + S/114 (mis-detected 0.1 GB/s x 2).
    assert setup.estimate_us("Ring", "LL", s) == pytest.approx(20.6 + s / 57.14, rel=1e-3)
    assert setup.estimate_us("Ring", "Simple", s) == pytest.approx(88.2 + s / 114.3, rel=1e-3)
    assert setup.estimate_us("Tree", "LL", 0) == pytest.approx(20.8)
    assert setup.estimate_us("Ring", "LL128", 0) == pytest.approx(49.0)
    assert setup.estimate_us("Tree", "LL128", 0) == pytest.approx(40.6)
    assert setup.estimate_us("Tree", "Simple", 0) == pytest.approx(64.4)
    # Between Ring/LL and Ring/Simple, Simple wins above ~7.7 KB (step A's checks compare rings).
    ring = _setup({"NCCL_ALGO": "Ring"})
    assert ring.choice(7000) == ("Ring", "LL")
    assert ring.choice(8500) == ("Ring", "Simple")
    # With Tree allowed, Tree/Simple's lower latency term wins just below 14 KB.
    assert setup.choice(7000) == ("Tree", "Simple")


def test_graph_file_keeps_ll_up_to_about_3_7_mb() -> None:
    setup = _setup({"NCCL_GRAPH_FILE": "graph.xml", "NCCL_ALGO": "Ring"})
    assert (setup.choice_bw_GBps, setup.choice_nchannels) == (24.0, 4)
    assert setup.choice(3_600_000) == ("Ring", "LL")
    assert setup.choice(3_800_000) == ("Ring", "Simple")
    # With Tree allowed, Tree/Simple takes over from Ring/LL at ~3.2 MB instead.
    both = _setup({"NCCL_GRAPH_FILE": "graph.xml"})
    assert both.choice(3_100_000) == ("Ring", "LL")
    assert both.choice(3_300_000) == ("Tree", "Simple")


def test_no_op_variables_change_nothing() -> None:
    base = _setup(LL_SYS)
    for extra in (
        {"NCCL_ALGO": "Ring"},
        {"NCCL_MAX_NCHANNELS": "4"},
        {"NCCL_MAX_NCHANNELS": "64"},
        {"NCCL_NTHREADS": "128"},
        {"NCCL_BUFFSIZE": "33554432"},
        {"NCCL_NVLS_ENABLE": "1"},
        {"NCCL_CUMEM_ENABLE": "0"},
        {"NCCL_SHM_DISABLE": "1"},
        {"NCCL_GRAPH_FILE": "g.xml"},
        {"NCCL_P2P_DISABLE": "0"},
        {"CUDA_VISIBLE_DEVICES": "0,1"},
    ):
        other = _setup({**LL_SYS, **extra})
        for s in SIZES:
            assert other.allreduce_us(s) == pytest.approx(base.allreduce_us(s)), extra


def test_consistency_gap_per_call() -> None:
    # Step B: the untuned-minus-tuned gap per call at 14 KB is 36.6 µs (measured 37.4).
    gap = _setup({}).allreduce_us(14336) - _setup(TUNED).allreduce_us(14336)
    assert gap == pytest.approx(36.6, abs=0.1)


def test_high_batch_forced_ll_is_slower_than_simple() -> None:
    # docs/twin-model.md, *Batching*: forced LL is ~30 % slower per call than Simple at ~2 MB.
    ll = _setup(LL_SYS).allreduce_us(2_000_000)
    simple = _setup({"NCCL_PROTO": "Simple", **SYS}).allreduce_us(2_000_000)
    assert ll / simple == pytest.approx(1.3, abs=0.1)


# ----------------------------------------------------------------------- failure classes


@pytest.mark.parametrize(
    "algo", ["NVLS", "CollNetDirect", "CollNetChain", "PAT", "NVLSTree", "nvls,pat"]
)
def test_no_algorithm_fails_at_first_collective(algo: str) -> None:
    setup = _setup({"NCCL_ALGO": algo, **LL_SYS})  # communicator init succeeds
    assert not setup.usable
    assert setup.algorithms == ()
    with pytest.raises(NcclNoAlgorithmError) as info:
        setup.allreduce_us(14336)
    message = str(info.value)
    assert "no algorithm/protocol available for function AllReduce" in message
    assert f"NCCL_ALGO was set to {algo}" in message
    assert "ncclInvalidUsage" in message
    assert info.value.reason is FailureReason.NCCL_FIRST_COLLECTIVE
    with pytest.raises(NcclNoAlgorithmError):
        setup.choice(14336)
    with pytest.raises(NcclNoAlgorithmError):
        PerfModel(PROFILE, setup, None).step_ms(1)


@pytest.mark.parametrize(
    ("var", "value", "detail"),
    [
        ("NCCL_PROTO", "LL256", 'Unrecognized element token "LL256"'),
        ("NCCL_PROTO", "LL, Simple", 'Unrecognized element token " Simple"'),
        ("NCCL_ALGO", "Ring,Mesh", 'Unrecognized element token "Mesh"'),
        ("NCCL_PROTO", "LL;Simple", "All entries except the first must have a prefix"),
        ("NCCL_PROTO", "LL;allreduce:Simple;LL128", "All entries except the first"),
        ("NCCL_PROTO", "allgatherv:LL", 'Unrecognized prefix token "allgatherv"'),
        ("NCCL_ALGO", "all_reduce:Ring", 'Unrecognized prefix token "all_reduce"'),
    ],
)
def test_bad_token_fails_at_init(var: str, value: str, detail: str) -> None:
    with pytest.raises(NcclInitError) as info:
        _setup({var: value})
    message = str(info.value)
    assert message.startswith("NCCL WARN ")
    assert detail in message
    assert "ncclInvalidUsage" in message
    assert info.value.reason is FailureReason.NCCL_INIT
    assert info.value.nccl_result == "ncclInvalidUsage"
    assert isinstance(info.value, RayspecError)


# --------------------------------------------------------------------------- list parsing


@pytest.mark.parametrize(
    ("value", "protocols"),
    [
        ("LL", ("LL",)),
        ("ll", ("LL",)),
        ("SIMPLE,ll128", ("LL128", "Simple")),
        ("^LL", ("LL128", "Simple")),
        ("^ll,simple", ("LL128",)),
        ("LL,Simple;allreduce:^LL", ("LL128", "Simple")),
        ("^LL128;allreduce:LL128", ("LL128",)),
        ("Simple;broadcast:LL", ("Simple",)),
        ("AllReduce:LL", ("LL",)),
        ("broadcast:LL", ("LL", "Simple")),  # nothing applies to AllReduce: unset
        ("allreduce:LL;allreduce:Simple", ("Simple",)),  # the later entry wins
        ("LL;", ("LL",)),  # empty entries vanish, as with strtok
        ("LL,,Simple", ("LL", "Simple")),
        ("", ("LL", "Simple")),  # empty value: unset
    ],
)
def test_proto_list_parsing(value: str, protocols: tuple[str, ...]) -> None:
    assert _setup({"NCCL_PROTO": value}).protocols == protocols


@pytest.mark.parametrize(
    ("value", "algorithms"),
    [
        ("Ring", ("Ring",)),
        ("tree", ("Tree",)),
        ("Ring,NVLS", ("Ring",)),  # unavailable names are dropped silently
        ("^Tree", ("Ring",)),
        ("^ring,tree", ()),
        ("Ring;allreduce:Tree", ("Tree",)),
        ("allgather:Ring", ("Tree", "Ring")),
    ],
)
def test_algo_list_parsing(value: str, algorithms: tuple[str, ...]) -> None:
    assert _setup({"NCCL_ALGO": value}).algorithms == algorithms


def test_default_sets() -> None:
    setup = _setup({})
    assert setup.protocols == ("LL", "Simple")  # LL128 only on NVLink rings (ll128_auto)
    assert setup.algorithms == ("Tree", "Ring")
    assert not setup.ll128_risk
    auto = dataclasses.replace(
        PROFILE, nccl_choice=dataclasses.replace(PROFILE.nccl_choice, ll128_auto=True)
    )
    assert _setup({}, auto).protocols == ("LL", "LL128", "Simple")
    assert not _setup({"NCCL_PROTO": "LL128"}, auto).ll128_risk


@pytest.mark.parametrize(
    ("value", "risk"),
    [
        ("LL128", True),
        ("^LL", True),
        ("LL,LL128,Simple", True),
        ("LL", False),
        ("^LL128", False),
        ("Simple;broadcast:LL128", False),
    ],
)
def test_ll128_risk_flag(value: str, risk: bool) -> None:
    setup = _setup({"NCCL_PROTO": value, **SYS})
    assert setup.ll128_risk is risk
    assert any("LL128" in w for w in setup.warnings) is risk


# ------------------------------------------------------------------------------ P2P level


@pytest.mark.parametrize(
    ("value", "level", "n_p2p"),
    [
        ("LOC", "LOC", 0),
        ("PIX", "PIX", 0),
        ("PXB", "PXB", 0),
        ("PHB", "PHB", 6),
        ("SYS", "SYS", 8),
        ("NVL", "NVL", 0),
        ("PXN", "PXN", 0),
        ("C2C", "C2C", 0),
        ("0", "LOC", 0),
        ("1", "PIX", 0),
        ("2", "PXB", 0),
        ("3", "PHB", 6),
        ("4", "SYS", 8),
        ("5", "SYS", 8),
        ("17", "SYS", 8),
        # Ignored: the default (PXB) applies.
        ("sys", "PXB", 0),
        ("Sys", "PXB", 0),
        ("NODE", "PXB", 0),
        ("-1", "PXB", 0),
        ("NET", "PXB", 0),
        ("DIS", "PXB", 0),
        # NCCL: first character a digit, then strtol(str, NULL, 0).
        ("4.0", "SYS", 8),
        ("3abc", "PHB", 6),
        ("0x3", "PHB", 6),
        ("010", "SYS", 8),  # octal 8, clamped to the last legacy level
        (" 4", "PXB", 0),  # not a digit first: ignored
    ],
)
def test_p2p_level(value: str, level: str, n_p2p: int) -> None:
    setup = _setup({"NCCL_P2P_LEVEL": value})
    assert setup.p2p_level == level
    assert setup.link_transports.count("P2P") == n_p2p
    assert setup.link_transports.count("SHM") == 8 - n_p2p


def test_ignored_level_is_reported() -> None:
    assert any("NCCL_P2P_LEVEL=sys" in w for w in _setup({"NCCL_P2P_LEVEL": "sys"}).warnings)
    assert _setup({"NCCL_P2P_LEVEL": "SYS"}).warnings == ()


@pytest.mark.parametrize(
    ("value", "disabled"),
    [
        ("1", True),
        ("0", False),
        ("2", False),
        ("true", False),
        ("yes", False),
        # NCCL reads it with strtol(str, NULL, 0) == 1.
        ("01", True),
        (" 1", True),
        ("1abc", True),
        ("0x1", True),
    ],
)
def test_p2p_disable_overrides_level(value: str, disabled: bool) -> None:
    setup = _setup({"NCCL_P2P_DISABLE": value, **SYS})
    assert (setup.p2p_level == "LOC") is disabled
    assert (setup.link_transports.count("P2P") == 0) is disabled


def test_nvml_p2p_unsupported_means_no_p2p() -> None:
    profile = dataclasses.replace(
        PROFILE, hardware=dataclasses.replace(PROFILE.hardware, nvml_p2p_supported=False)
    )
    assert _setup(SYS, profile).link_transports == ("SHM",) * 8


@pytest.mark.parametrize(
    ("value", "net"), [("1", True), ("0x1", True), ("0", False), ("2", False), ("1abc", False)]
)
def test_shm_disable_parsing(value: str, net: bool) -> None:
    # An NCCL integer parameter: the whole string must parse (base 0), else the default.
    setup = _setup({"NCCL_SHM_DISABLE": value})
    assert (setup.link_transports == ("NET",) * 8) is net
    assert any("Invalid value" in w for w in setup.warnings) is (value == "1abc")


def test_shm_disable_uses_net_only_where_p2p_is_off() -> None:
    assert _setup({"NCCL_SHM_DISABLE": "1"}).link_transports == ("NET",) * 8
    mixed = _setup({"NCCL_SHM_DISABLE": "1", "NCCL_P2P_LEVEL": "PHB"})
    assert mixed.link_transports == ("P2P",) * 6 + ("NET",) * 2
    assert _setup({"NCCL_SHM_DISABLE": "0"}).link_transports == ("SHM",) * 8


def test_switches_topology_variant() -> None:
    profile = dataclasses.replace(
        PROFILE,
        hardware=dataclasses.replace(
            PROFILE.hardware, ring_link_paths=("PIX",) * 6 + ("PHB",) * 2
        ),
    )
    untuned = _setup({}, profile)
    assert untuned.link_transports == ("P2P",) * 6 + ("SHM",) * 2
    # A smaller untuned penalty than direct attach: 2 SHM links instead of 8.
    assert untuned.allreduce_us(14336) < _setup({}).allreduce_us(14336) - 10


def test_hang_on_broken_p2p() -> None:
    broken = dataclasses.replace(
        PROFILE, hardware=dataclasses.replace(PROFILE.hardware, p2p_broken=True)
    )
    assert _setup(SYS, broken).hang
    assert _setup({"NCCL_P2P_LEVEL": "PHB"}, broken).hang
    assert not _setup({}, broken).hang  # default level: every link is SHM
    assert not _setup({"NCCL_P2P_DISABLE": "1", **SYS}, broken).hang
    assert not _setup(SYS).hang


# ------------------------------------------------------------------------------- clamping


@pytest.mark.parametrize(
    ("value", "nthreads", "warned"),
    [
        ("512", 512, False),
        ("256", 256, False),
        ("96", 96, False),
        ("64", 64, False),
        ("50", 512, True),
        ("1000", 512, True),
        ("1024", 512, True),
        ("32", 64, True),
        ("0", None, False),
        ("-64", None, False),
        ("abc", None, True),
    ],
)
def test_nthreads_clamping(value: str, nthreads: int | None, warned: bool) -> None:
    setup = _setup({"NCCL_NTHREADS": value})
    assert setup.nthreads == nthreads
    assert any("NTHREADS" in w for w in setup.warnings) is warned


def test_nthreads_bandwidth_factor_spares_ll128() -> None:
    env = {"NCCL_PROTO": "LL128", **SYS}
    assert _setup({**env, "NCCL_NTHREADS": "64"}).allreduce_us(86016) == pytest.approx(
        _setup(env).allreduce_us(86016)
    )
    simple = {"NCCL_PROTO": "Simple", **SYS}
    assert _setup({**simple, "NCCL_NTHREADS": "64"}).allreduce_us(86016) > _setup(
        simple
    ).allreduce_us(86016)


@pytest.mark.parametrize(
    ("env", "max_nch"),
    [
        ({"NCCL_MAX_NCHANNELS": "0"}, 1),
        ({"NCCL_MAX_NCHANNELS": "-3"}, 1),
        ({"NCCL_MAX_NCHANNELS": "100"}, 64),
        ({"NCCL_MAX_NCHANNELS": "16"}, 16),
        ({"NCCL_MAX_NRINGS": "2"}, 2),
        ({"NCCL_MAX_NCHANNELS": "8", "NCCL_MAX_NRINGS": "2"}, 8),
        ({}, None),
        ({"NCCL_MAX_NCHANNELS": "x"}, None),
        ({"NCCL_MAX_NCHANNELS": "0x10"}, 16),
        ({"NCCL_MAX_NCHANNELS": " 2"}, 2),
        ({"NCCL_MAX_NCHANNELS": "2k"}, None),
    ],
)
def test_max_nchannels_clamping(env: dict[str, str], max_nch: int | None) -> None:
    assert _setup(env).max_nchannels == max_nch


def test_max_nchannels_lowers_the_estimates_channels() -> None:
    assert _setup({"NCCL_MAX_NCHANNELS": "1"}).choice_nchannels == 1
    assert _setup({"NCCL_MAX_NCHANNELS": "16"}).choice_nchannels == 2
    assert _setup({"NCCL_MIN_NCHANNELS": "100"}).choice_nchannels == 64


def test_setup_records_only_nccl_variables() -> None:
    setup = _setup({"NCCL_PROTO": "LL", "PATH": "/bin", "NCCL_ALGO": ""})
    assert dict(setup.env) == {"NCCL_PROTO": "LL"}
    assert "AllReduce Ring/LL" in setup.describe()
    assert "no AllReduce" in _setup({"NCCL_ALGO": "PAT"}).describe()


# ------------------------------------------------------- machines where multicast is forbidden

NO_MULTICAST = dataclasses.replace(
    PROFILE, hardware=dataclasses.replace(PROFILE.hardware, multicast_forbidden=True)
)


@pytest.mark.parametrize(
    "env",
    [
        {"NCCL_NVLS_ENABLE": "1"},
        {"NCCL_NVLS_ENABLE": "2"},
        {"NCCL_ALGO": "NVLS"},
        {"NCCL_ALGO": "Ring,nvlstree"},
        {"NCCL_ALGO": "^Ring"},
    ],
)
def test_multicast_forbidden_is_rejected_loudly(env: dict[str, str]) -> None:
    with pytest.raises(NcclForbiddenError, match="forbidden on this machine") as info:
        _setup(env, NO_MULTICAST)
    assert isinstance(info.value, NcclInitError)
    assert info.value.reason is FailureReason.NCCL_INIT
    # The same settings are merely useless (or a first-collective failure) elsewhere.
    _setup(env, PROFILE)


def test_multicast_forbidden_allows_the_rest() -> None:
    for env in ({"NCCL_NVLS_ENABLE": "0"}, {"NCCL_ALGO": "Ring,Tree"}, TUNED, {}):
        _setup(env, NO_MULTICAST)
