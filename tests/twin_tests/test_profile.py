"""Profiles: the built-in reference profile holds every constant of the model (docs/twin-model.md),
and
loading is strict (missing, unknown or mistyped keys raise ProfileError naming the key)."""

from __future__ import annotations

import copy
import pathlib
from typing import Any

import pytest
import yaml

from rayspec._exceptions import RayspecError
from rayspec.twin._errors import ProfileError
from rayspec.twin._profile import AcceptanceProfile
from rayspec.twin._profile import NoiseProfile
from rayspec.twin._profile import Profile
from rayspec.twin._profile import available_profiles
from rayspec.twin._profile import load_profile
from rayspec.twin._profile import profile_from_dict

NAME = "kimi-k2.5-tp8-pcie"
PROFILE_FILE = pathlib.Path(__file__).parents[2] / "rayspec" / "twin" / "profiles" / f"{NAME}.yaml"


@pytest.fixture()
def raw() -> dict[str, Any]:
    """The reference profile as parsed YAML, to be mutated by a test."""
    data = yaml.safe_load(PROFILE_FILE.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return copy.deepcopy(data)


def _write(tmp_path: pathlib.Path, data: Any) -> str:
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return str(path)


def test_builtin_name_is_listed_and_loads() -> None:
    assert NAME in available_profiles()
    profile = load_profile(NAME)
    assert isinstance(profile, Profile)
    assert profile.name == NAME


# Every constant of the reference profile, as (getter, value).
SECTION_9 = [
    (lambda p: p.hardware.n_ranks, 8),
    (lambda p: p.hardware.ring_link_paths, ("PHB",) * 6 + ("SYS",) * 2),
    (lambda p: p.hardware.nvml_p2p_supported, True),
    (lambda p: p.hardware.p2p_broken, False),
    (lambda p: p.hardware.multicast_forbidden, False),
    (lambda p: (p.nccl_choice.detected.bw_GBps, p.nccl_choice.detected.nchannels), (0.1, 2)),
    (
        lambda p: (
            p.nccl_choice.detected_with_graph_file.bw_GBps,
            p.nccl_choice.detected_with_graph_file.nchannels,
        ),
        (24.0, 4),
    ),
    (lambda p: dict(p.nccl_choice.base_lat_us["Ring"]), {"LL": 6.6, "LL128": 14.0, "Simple": 8.4}),
    (lambda p: dict(p.nccl_choice.base_lat_us["Tree"]), {"LL": 6.8, "LL128": 14.0, "Simple": 8.4}),
    (lambda p: dict(p.nccl_choice.hw_lat_us["Ring"]), {"LL": 1.0, "LL128": 2.5, "Simple": 5.7}),
    (lambda p: dict(p.nccl_choice.hw_lat_us["Tree"]), {"LL": 1.0, "LL128": 1.9, "Simple": 4.0}),
    (lambda p: p.nccl_choice.ll_max_bw_GBps, 141.0),
    (lambda p: p.nccl_choice.ll128_per_channel_bw_GBps, 40.0),
    (
        lambda p: (
            p.nccl_choice.tree_bw.base,
            p.nccl_choice.tree_bw.LL_div,
            round(p.nccl_choice.tree_bw.LL128_mul, 4),
            p.nccl_choice.tree_bw.alg_mul,
        ),
        (0.92, 3.8, round(7 / 9, 4), 0.5),
    ),
    (lambda p: p.nccl_choice.default_p2p_level, "PXB"),
    (lambda p: p.nccl_choice.ll128_auto, False),
    (lambda p: p.nccl_choice.choice_uses_min_channels, True),
    (lambda p: p.nccl_choice.max_channels_limit, 64),
    (lambda p: p.allreduce_cost.algos["Ring"]["LL"].A_us, 24.5),
    (lambda p: p.allreduce_cost.algos["Ring"]["LL"].S0_B, 49152),
    (lambda p: p.allreduce_cost.algos["Ring"]["LL"].B_GBps, 14),
    (
        lambda p: (
            p.allreduce_cost.algos["Ring"]["Simple"].A_us,
            p.allreduce_cost.algos["Ring"]["Simple"].B_GBps,
        ),
        (46.5, 26),
    ),
    (
        lambda p: (
            p.allreduce_cost.algos["Ring"]["LL128"].A_us,
            p.allreduce_cost.algos["Ring"]["LL128"].B_GBps,
        ),
        (33, 24),
    ),
    (
        lambda p: [p.allreduce_cost.algos["Tree"][x].A_us for x in ("LL", "LL128", "Simple")],
        [26, 35, 42],
    ),
    (
        lambda p: [p.allreduce_cost.algos["Tree"][x].S0_B for x in ("LL", "LL128", "Simple")],
        [49152, 0, 0],
    ),
    (
        lambda p: [p.allreduce_cost.algos["Tree"][x].B_GBps for x in ("LL", "LL128", "Simple")],
        [7, 18, 18],
    ),
    (lambda p: dict(p.allreduce_cost.hop_penalty_us), {"P2P": 0.0, "SHM": 0.98, "NET": 12.0}),
    (lambda p: dict(p.allreduce_cost.bw_factor), {"SHM": 0.6, "NET": 0.2}),
    (
        lambda p: (p.allreduce_cost.full_bw_min_channels, p.allreduce_cost.full_bw_min_threads),
        (4, 128),
    ),
    (lambda p: (p.model.hidden, p.model.layers, p.model.vocab), (7168, 61, 163840)),
    (lambda p: (p.model.moe.n_experts, p.model.moe.experts_per_token), (384, 8)),
    (lambda p: p.model.act_bytes, 2),
    (lambda p: p.model.collectives_per_forward, 124),
    (lambda p: p.model.kv_bytes_per_token_layer, 1152),
    (lambda p: p.model.kv_bw_bytes_per_ms, 1.41e9),
    (lambda p: p.model.calib_context, 1000),
    (lambda p: p.model.token_bytes, 14336),
    (lambda p: (p.forward.C0_ms, p.forward.W0_ms, p.forward.c_e_ms), (8.255, 4.04, 0.0838)),
    (lambda p: (p.forward.p_tok_ms, p.forward.flop_tok_ms), (0.08, 0.040)),
    (
        lambda p: (p.speculative.F_spec_ms, p.speculative.D0_ms, p.speculative.d_step_ms),
        (6.228, 0.718, 0.030),
    ),
    (lambda p: p.speculative.draft_collectives_per_step, 3),
    (
        lambda p: (p.drafter.acceptance.kind, p.drafter.acceptance.a1, p.drafter.acceptance.rho),
        ("geometric", 0.635, 0.632),
    ),
    (lambda p: (p.drafter.a_cap, p.drafter.tree_theta), (0.99, 0.34)),
    (
        lambda p: (p.noise.sigma_time, p.noise.accept_floor, p.noise.sigma_start),
        (0.003, 0.5, 0.01),
    ),
    # docs/twin-model.md, *Noise*: the twin samples every cycle, so sigma_accept is the per-cycle-
    # sampling value.
    (lambda p: p.noise.sigma_accept, 0.056),
]


@pytest.mark.parametrize("index", range(len(SECTION_9)))
def test_reference_constants(index: int) -> None:
    getter, expected = SECTION_9[index]
    assert getter(load_profile(NAME)) == expected


def test_uncalibrated_placeholders_are_labelled() -> None:
    text = PROFILE_FILE.read_text(encoding="utf-8")
    section = text.split("uncalibrated:", 1)[1]
    for key in ("prefill_base_ms", "prefill_ms_per_token", "startup_s", "cuda_graph_capture_s"):
        line = next(li for li in section.splitlines() if li.strip().startswith(key))
        assert "UNCALIBRATED" in line, line
    u = load_profile(NAME).uncalibrated
    # TTFT of a short prompt lands in the 60-110 ms anchor (docs/twin-model.md, *Open points*).
    assert 60 <= u.prefill_base_ms + 100 * u.prefill_ms_per_token <= 110


def test_load_by_path_equals_builtin(tmp_path: pathlib.Path, raw: dict[str, Any]) -> None:
    assert load_profile(_write(tmp_path, raw)) == load_profile(NAME)


def test_unknown_name_lists_builtins() -> None:
    with pytest.raises(ProfileError, match=NAME):
        load_profile("no-such-profile")


def test_missing_file(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ProfileError, match="no such file"):
        load_profile(str(tmp_path / "absent.yaml"))


def test_profile_error_is_value_error_and_rayspec_error() -> None:
    assert issubclass(ProfileError, ValueError)
    assert issubclass(ProfileError, RayspecError)


def test_invalid_yaml(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("hardware: [unclosed\n", encoding="utf-8")
    with pytest.raises(ProfileError, match="not valid YAML"):
        load_profile(str(path))


def test_top_level_must_be_mapping(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ProfileError, match="mapping"):
        load_profile(_write(tmp_path, [1, 2]))


@pytest.mark.parametrize(
    ("section", "key"),
    [
        ("forward", "C0_ms"),
        ("hardware", "ring_link_paths"),
        ("noise", "sigma_accept"),
        ("speculative", "F_spec_ms"),
        ("uncalibrated", "prefill_ms_per_token"),
    ],
)
def test_missing_key_is_named(
    tmp_path: pathlib.Path, raw: dict[str, Any], section: str, key: str
) -> None:
    del raw[section][key]
    with pytest.raises(ProfileError, match=rf"'{section}\.{key}' is missing"):
        load_profile(_write(tmp_path, raw))


def test_missing_nested_key_is_named(tmp_path: pathlib.Path, raw: dict[str, Any]) -> None:
    del raw["allreduce_cost"]["algos"]["Ring"]["LL"]["S0_B"]
    with pytest.raises(ProfileError, match=r"'allreduce_cost\.algos\.Ring\.LL\.S0_B' is missing"):
        load_profile(_write(tmp_path, raw))


def test_missing_section_is_named(tmp_path: pathlib.Path, raw: dict[str, Any]) -> None:
    del raw["drafter"]
    with pytest.raises(ProfileError, match="'drafter' is missing"):
        load_profile(_write(tmp_path, raw))


def test_unknown_key_is_named(tmp_path: pathlib.Path, raw: dict[str, Any]) -> None:
    raw["forward"]["C0ms"] = 8.0  # a typo next to the real key
    with pytest.raises(ProfileError, match=r"'forward\.C0ms' is not a known key"):
        load_profile(_write(tmp_path, raw))


def test_unknown_top_level_key_is_named(tmp_path: pathlib.Path, raw: dict[str, Any]) -> None:
    raw["extras"] = {}
    with pytest.raises(ProfileError, match="'extras' is not a known key"):
        load_profile(_write(tmp_path, raw))


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("forward", "C0_ms"), "8.2", "must be a number"),
        (("hardware", "n_ranks"), 8.0, "must be an integer"),
        (("hardware", "n_ranks"), True, "must be an integer"),
        (("hardware", "p2p_broken"), "no", "must be true or false"),
        (("drafter", "a_cap"), 1.5, "must be a probability"),
        (("model", "kv_bw_bytes_per_ms"), 0, "must be > 0"),
        (("forward", "c_e_ms"), -0.1, "must be >= 0"),
        (("forward", "C0_ms"), float("nan"), "must be finite"),
        (("hardware", "ring_link_paths"), "PHB", "must be a non-empty list"),
    ],
)
def test_mistyped_value_is_named(
    tmp_path: pathlib.Path, raw: dict[str, Any], path: tuple[str, str], value: Any, message: str
) -> None:
    raw[path[0]][path[1]] = value
    with pytest.raises(ProfileError, match=rf"'{path[0]}\.{path[1]}' {message}"):
        profile_from_dict(raw)


def test_unknown_link_path(raw: dict[str, Any]) -> None:
    raw["hardware"]["ring_link_paths"][0] = "NODE"
    with pytest.raises(ProfileError, match="ring_link_paths.*NODE"):
        profile_from_dict(raw)


def test_link_count_must_match_ranks(raw: dict[str, Any]) -> None:
    raw["hardware"]["ring_link_paths"] = ["SYS"] * 7
    with pytest.raises(ProfileError, match="one path per ring link"):
        profile_from_dict(raw)


def test_noise_off(tmp_path: pathlib.Path) -> None:
    text = PROFILE_FILE.read_text(encoding="utf-8")
    head, tail = text.split("\nnoise:", 1)
    rest = tail.split("\nuncalibrated:", 1)[1]
    path = tmp_path / "quiet.yaml"
    path.write_text(head + "\nnoise: off\nuncalibrated:" + rest, encoding="utf-8")
    profile = load_profile(str(path))
    assert profile.noise == NoiseProfile.off()
    assert not profile.noise.enabled
    assert load_profile(NAME).noise.enabled


def test_acceptance_kinds(raw: dict[str, Any]) -> None:
    raw["drafter"]["acceptance"] = {"kind": "flat", "a": 0.75}
    flat = profile_from_dict(raw).drafter.acceptance
    assert flat == AcceptanceProfile(kind="flat", a=0.75)
    assert [flat.base(j) for j in (1, 5)] == [0.75, 0.75]
    raw["drafter"]["acceptance"] = {"kind": "per_depth", "a": [0.6, 0.5]}
    per_depth = profile_from_dict(raw).drafter.acceptance
    assert [per_depth.base(j) for j in (1, 2, 3, 9)] == [0.6, 0.5, 0.5, 0.5]
    geometric = load_profile(NAME).drafter.acceptance
    assert [round(geometric.base(j), 3) for j in range(1, 6)] == [
        0.635,
        0.401,
        0.254,
        0.160,
        0.101,
    ]


@pytest.mark.parametrize(
    ("acceptance", "message"),
    [
        ({"kind": "chain", "a": 0.7}, "must be one of geometric, flat, per_depth"),
        ({"kind": "flat", "a": 0.7, "rho": 0.5}, "'drafter.acceptance.rho' is not a known key"),
        ({"kind": "per_depth", "a": []}, "non-empty list"),
        ({"kind": "geometric", "a1": 0.6}, "'drafter.acceptance.rho' is missing"),
    ],
)
def test_bad_acceptance(raw: dict[str, Any], acceptance: dict[str, Any], message: str) -> None:
    raw["drafter"]["acceptance"] = acceptance
    with pytest.raises(ProfileError, match=message):
        profile_from_dict(raw)


def test_dense_model(raw: dict[str, Any]) -> None:
    raw["model"]["moe"] = None
    assert profile_from_dict(raw).model.moe is None


def test_only_ring_and_tree_are_modelled(raw: dict[str, Any]) -> None:
    raw["allreduce_cost"]["algos"]["NVLS"] = raw["allreduce_cost"]["algos"]["Ring"]
    with pytest.raises(ProfileError, match=r"'allreduce_cost\.algos\.NVLS' is not a known key"):
        profile_from_dict(raw)


def test_profile_is_immutable() -> None:
    profile = load_profile(NAME)
    with pytest.raises(TypeError):
        profile.allreduce_cost.algos["Ring"]["LL"] = None  # type: ignore[index]
    with pytest.raises(TypeError):
        profile.nccl_choice.base_lat_us["Ring"]["LL"] = 0.0  # type: ignore[index]
