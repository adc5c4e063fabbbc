"""Adaptive speculative decoding and the overlap scheduler in the twin (SGLang 0.5.23 rules)."""

from __future__ import annotations

import json

import pytest

from rayspec.twin._adaptive import AdaptiveSteps
from rayspec.twin._adaptive import StepSlot
from rayspec.twin._adaptive import load_tiers
from rayspec.twin._args import parse_args
from rayspec.twin._resolve import NON_OVERLAP_WARNING
from rayspec.twin._resolve import resolve_server_args
from rayspec.twin._simulate import SimulatedServer

ARCH = "DeepseekV3ForCausalLM"
BASE = ["--model-path", "m", "--tp-size", "8", "--twin-seed", "3", "--max-running-requests", "48"]


def _chain(steps: int, *extra: str) -> list[str]:
    return [
        *BASE, "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", str(steps),
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(steps + 1), *extra,
    ]  # fmt: skip


def _resolve(argv: list[str], env: dict[str, str] | None = None):
    return resolve_server_args(parse_args(argv), architecture=ARCH, env=env or {})


def test_sglang_default_tiers_and_their_union() -> None:
    tiers = load_tiers(None)
    assert sorted(tiers) == [1, 8, 32, 64]
    assert AdaptiveSteps(3, tiers).candidate_steps == [0, 1, 3, 5, 7]


def test_a_tier_file_with_shared_defaults(tmp_path) -> None:
    path = tmp_path / "tiers.json"
    path.write_text(json.dumps({"ema_alpha": 0.5, "1": {"candidate_steps": [2, 4]}}))
    assert load_tiers(str(path)) == {1: {"ema_alpha": 0.5, "candidate_steps": [2, 4]}}
    path.write_text(json.dumps({"x": {}}))
    with pytest.raises(ValueError, match="at least one integer-string BS key"):
        load_tiers(str(path))
    path.write_text(json.dumps({"4": {"candidate_steps": [-1]}}))
    with pytest.raises(ValueError, match="BS 4: candidate_steps must be"):
        load_tiers(str(path))


def test_the_slot_rises_and_falls_with_acceptance_after_warmup() -> None:
    slot = StepSlot(3, {"candidate_steps": [1, 3, 5, 7]})
    # Ten warm-up batches never move it, however good the drafts.
    assert not any(slot.update([4]) for _ in range(10)) and slot.current_steps == 3
    for _ in range(4):
        slot.update([4])
    # The 5th batch after warm-up: EMA 3.93 rises past 3 - 0.5, not past 5 - 0.5.
    assert slot.update([4]) and slot.current_steps == 5
    low = StepSlot(3, {"candidate_steps": [0, 1, 3]})
    visited = set()
    for _ in range(60):
        low.update([0])
        visited.add(low.current_steps)
    # Nothing accepted: down to no speculation, with a probe of 1 step now and then.
    assert visited == {3, 1, 0} and low.ema_accept_len < 0.5


def test_batches_route_to_the_largest_tier_not_above_them() -> None:
    steps = AdaptiveSteps(3, load_tiers(None))
    # A tier whose candidates lack the start step starts at their middle (32: [0, 1] -> 1).
    assert [steps.steps_for(b) for b in (1, 7, 8, 31, 32, 100)] == [3, 3, 3, 3, 1, 0]


def test_resolution_of_adaptive_steps() -> None:
    res = _resolve([*BASE, "--speculative-algorithm", "EAGLE3", "--speculative-adaptive"])
    assert res.spec is not None and res.spec.adaptive
    # No steps given: the middle of [0, 1, 3, 5, 7]; topk 1; ndt = steps + 1.
    assert (res.spec.num_steps, res.spec.eagle_topk, res.spec.num_draft_tokens) == (3, 1, 4)
    assert res.adaptive_tiers is not None
    with pytest.raises(ValueError, match="is not in the adaptive config candidate_steps"):
        _resolve(_chain(2, "--speculative-adaptive"))
    tree = _resolve([*_chain(3), "--speculative-adaptive"][:-1] + ["--speculative-adaptive"])
    assert tree.spec is not None and tree.spec.adaptive
    fallback = _resolve([
        *BASE, "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
        "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "8",
        "--speculative-adaptive",
    ])  # fmt: skip
    assert fallback.spec is not None and not fallback.spec.adaptive
    assert any("speculative_adaptive disabled: speculative_eagle_topk=4" in w
               for w in fallback.warnings)  # fmt: skip


def test_adaptive_flags_exist_from_0_5_23_only() -> None:
    with pytest.raises(SystemExit):
        parse_args([*_chain(3, "--speculative-adaptive"), "--twin-version", "0.5.21"])


def test_the_overlap_scheduler_switch_by_version() -> None:
    on = _resolve(_chain(2))
    off = _resolve(_chain(2, "--disable-overlap-schedule"))
    assert on.spec is not None and on.spec.overlap and NON_OVERLAP_WARNING not in on.warnings
    assert off.spec is not None and not off.spec.overlap and NON_OVERLAP_WARNING in off.warnings
    old = [*_chain(2), "--twin-version", "0.5.12"]
    assert _resolve(old).spec.overlap  # type: ignore[union-attr]
    assert not _resolve(old, {"SGLANG_ENABLE_SPEC_V2": "False"}).spec.overlap  # type: ignore[union-attr]
    # Trees have no overlap scheduler to turn off.
    tree = [*BASE, "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "2",
            "--speculative-eagle-topk", "4", "--speculative-num-draft-tokens", "6",
            "--disable-overlap-schedule"]  # fmt: skip
    assert _resolve(tree).spec.overlap  # type: ignore[union-attr]


def _tok_s(argv: list[str], profile: str) -> float:
    server = SimulatedServer([*argv, "--twin-profile", profile], {})
    runs = [server.generate(40, 500) for _ in range(20)]
    return sum(r.completion_tokens for r in runs) / sum(r.e2e_ms for r in runs) * 1000


def test_overlap_off_costs_and_adaptive_follows_acceptance(tmp_path) -> None:
    profile = "h200-nvlink-tp8-dense"
    assert _tok_s(_chain(3, "--disable-overlap-schedule"), profile) < _tok_s(_chain(3), profile)
    # SGLang's default tiers hold 3 steps here (EMA ~1.7 accepted drafts, rise above 2.5);
    # a tier that rises eagerly (up_hysteresis -1: above 1.5) moves to 5 and stays.
    tiers = tmp_path / "tiers.json"
    tiers.write_text(json.dumps({"1": {"candidate_steps": [1, 3, 5, 7], "up_hysteresis": -1}}))
    for config, settled in ((None, 3), (str(tiers), 5)):
        extra = ["--speculative-adaptive"]
        if config:
            extra += ["--speculative-adaptive-config", config]
        server = SimulatedServer([*_chain(3, *extra), "--twin-profile", profile], {})
        for _ in range(10):
            server.generate(40, 300)
        assert server.adaptive is not None and server.adaptive.steps_for(1) == settled


def test_adaptive_mode_costs_the_profiles_adaptive_ms_every_iteration() -> None:
    """``speculative.adaptive_ms`` [est]: added to every iteration of an adaptive server, its
    plain-decoding tiers included, and to nothing else."""
    from rayspec import SpecSettings
    from rayspec.twin import PerfModel
    from rayspec.twin import load_profile
    from rayspec.twin import resolve_nccl

    profile = load_profile("kimi-k2.5-tp8-pcie")
    extra = profile.speculative.adaptive_ms
    assert extra == 0.15
    nccl = resolve_nccl({"NCCL_PROTO": "LL"}, profile)
    static = PerfModel(profile, nccl, SpecSettings("EAGLE3", 2, 1, 3))
    adaptive = PerfModel(profile, nccl, SpecSettings("EAGLE3", 2, 1, 3, adaptive=True))
    assert adaptive.step_ms(4) == pytest.approx(static.step_ms(4) + extra)
    plain = PerfModel(profile, nccl, None)
    assert adaptive.with_steps(0).step_ms(8) == pytest.approx(plain.step_ms(8) + extra)
    assert adaptive.with_steps(3).step_ms(1) == pytest.approx(
        static.with_steps(3).step_ms(1) + extra
    )
    assert static.with_steps(0).step_ms(8) == pytest.approx(plain.step_ms(8))
