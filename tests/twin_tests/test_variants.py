"""The twin's model variants (docs/twin-model.md, *Model variants*): optional profile keys that
change one mechanism each, read strictly, absent from every built-in profile, and honoured alike
by the in-process simulation and the HTTP twin (one model)."""

from __future__ import annotations

import os
from importlib import resources
from typing import Any

import pytest
import yaml

from rayspec import Candidate
from rayspec import SpecSettings
from rayspec._config import load_config
from rayspec.bench import request_input
from rayspec.bench import run_benchmark_detailed
from rayspec.server import build_launch
from rayspec.testing._twin import TwinProcess
from rayspec.tune._trial import bench_plan
from rayspec.twin import PerfModel
from rayspec.twin import ProfileError
from rayspec.twin import available_profiles
from rayspec.twin import load_profile
from rayspec.twin import resolve_nccl
from rayspec.twin._profile import profile_from_dict
from rayspec.twin._simulate import SimulatedServer
from rayspec.twin._text import count_prompt_tokens
from tests.helpers import TWIN_EXPERIMENT

LL_SYS = {"NCCL_P2P_LEVEL": "SYS", "NCCL_PROTO": "LL"}
SIZES = [1, 2, 4, 8, 12, 16]


def _field() -> dict[str, Any]:
    ref = resources.files("rayspec.twin").joinpath("profiles", "kimi-k2.5-tp8-pcie.yaml")
    data: dict[str, Any] = yaml.safe_load(ref.read_text(encoding="utf-8"))
    return data


def _variant(**changes: dict[str, Any]) -> dict[str, Any]:
    data = _field()
    for section, keys in changes.items():
        data[section].update(keys)
    return data


def _model(data: dict[str, Any], spec: SpecSettings | None) -> PerfModel:
    profile = profile_from_dict(data)
    return PerfModel(profile, resolve_nccl(LL_SYS, profile), spec)


def test_no_built_in_profile_sets_a_variant() -> None:
    for name in available_profiles():
        p = load_profile(name)
        assert p.forward.graph_token_sizes == ()
        assert (p.speculative.topk_step_ms, p.speculative.tree_verify_ms_per_token) == (0, 0)


def test_a_graphed_verify_costs_as_the_next_captured_size() -> None:
    plain, stepped = _field(), _variant(forward={"graph_token_sizes": SIZES})
    for n, padded in ((3, 4), (4, 4), (5, 8), (8, 8), (9, 12)):
        spec = SpecSettings("EAGLE3", 2, 4, n)
        m = _model(stepped, spec)
        f_spec = m.profile.speculative.f_spec_ms(True)
        assert m.verify_ms() == pytest.approx(m.forward_ms(padded, 1) + f_spec)
        # Eagerly it runs its own token count, as the plain model does everywhere.
        assert m.verify_ms(graph=False) == pytest.approx(_model(plain, spec).verify_ms())
    # A decode batch pads too (batch 3 runs as 4); batch 1 is a captured size.
    off, base = _model(stepped, None), _model(plain, None)
    assert off.step_ms(3) == pytest.approx(base.forward_ms(4, 3))
    assert off.step_ms(1) == base.step_ms(1)
    assert off.step_ms(20) == pytest.approx(base.forward_ms(20, 20))  # beyond the largest


def test_a_trees_draft_step_pays_its_topk_super_linearly() -> None:
    data = _variant(speculative={"topk_step_ms": 0.05, "topk_power": 2.0})
    for m_, extra in ((1, 0.0), (2, 0.15), (4, 0.75), (8, 3.15)):
        k = 3
        n = k + 1 if m_ == 1 else 6
        spec = SpecSettings("EAGLE3", k, m_, n)
        assert _model(data, spec).draft_ms() - _model(_field(), spec).draft_ms() == (
            pytest.approx(k * extra)
        )


def test_a_trees_verify_pays_per_token_and_a_chains_does_not() -> None:
    data = _variant(speculative={"tree_verify_ms_per_token": 0.1})
    tree, chain = SpecSettings("EAGLE3", 2, 4, 6), SpecSettings("EAGLE3", 5, 1, 6)
    assert _model(data, tree).verify_ms() - _model(_field(), tree).verify_ms() == (
        pytest.approx(0.6)
    )
    assert _model(data, chain).verify_ms() == _model(_field(), chain).verify_ms()


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("forward", "graph_token_sizes", [1, 4, 2], "must be strictly ascending"),
        ("forward", "graph_token_sizes", [], "must be a non-empty list"),
        ("forward", "graph_token_sizes", [0, 2], "must hold integers >= 1"),
        ("speculative", "topk_power", 0.5, "must be >= 1.0"),
        ("speculative", "tree_verify_ms_per_token", "x", "must be a number"),
    ],
)
def test_a_bad_variant_key_is_named(section: str, key: str, value: Any, message: str) -> None:
    with pytest.raises(ProfileError, match=rf"'{section}\.{key}' {message}"):
        profile_from_dict(_variant(**{section: {key: value}}))


def test_the_http_twin_and_the_simulation_serve_the_same_variant(tmp_path: Any) -> None:
    """Every variant at once, noise off: a tree's requests take as long over HTTP (the twin's
    clock) as in process, and the variants cost this tree's cycle 16.5 % more than the plain
    model's."""
    data = _variant(
        forward={"graph_token_sizes": SIZES},
        speculative={"topk_step_ms": 0.05, "topk_power": 2.0, "tree_verify_ms_per_token": 0.1},
    )
    data["noise"] = False
    path = os.path.join(str(tmp_path), "variant.yaml")
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(data, fh, sort_keys=False)
    cfg = load_config(
        TWIN_EXPERIMENT,
        ["bench.max_tokens=60", "bench.repeats=1", f"server.twin.profile={path}"],
    )
    cand = Candidate(nccl_env=tuple(sorted(LL_SYS.items())), spec=SpecSettings("EAGLE3", 2, 4, 6))
    launch = build_launch(cfg, cand, port=0, log_path="-", trial=3)
    args = list(launch.argv[3:])
    for flag in ("--port", "--host"):  # TwinProcess picks its own
        i = args.index(flag)
        del args[i : i + 2]
    plan = bench_plan(cfg)
    with TwinProcess(args, env=dict(launch.env)) as twin:
        twin.wait_ready()
        served = run_benchmark_detailed(twin.base_url, plan).records
    sim = SimulatedServer(args, dict(launch.env))
    scenario = plan.scenarios[0]
    for rec in served:
        ask = request_input(scenario, rec.run, rec.index)
        got = sim.generate(count_prompt_tokens(ask.prompt), ask.max_tokens)
        assert got.verify_ct == rec.spec_verify_ct
        assert got.e2e_ms == pytest.approx(rec.e2e_ms, rel=0.02)
    plain = _model(_field(), cand.spec)
    assert sim.model.step_ms(1) / plain.step_ms(1) == pytest.approx(1.165, abs=0.005)
