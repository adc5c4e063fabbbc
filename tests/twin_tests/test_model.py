"""PerfModel and NoiseModel against docs/twin-model.md (its worked values) and the field table
there.

Deterministic rows use expected values (no noise). The Monte-Carlo checks are seeded.
"""

from __future__ import annotations

import dataclasses
import random
import statistics

import pytest

from rayspec._exceptions import FailureReason
from rayspec._types import SpecSettings
from rayspec.testing import FIELD_TUNED_NCCL
from rayspec.twin._errors import DraftTreeError
from rayspec.twin._model import PerfModel
from rayspec.twin._model import build_draft_tree
from rayspec.twin._model import tree_fits
from rayspec.twin._nccl import NcclSetup
from rayspec.twin._nccl import resolve_nccl
from rayspec.twin._noise import NoiseModel
from rayspec.twin._noise import RequestNoise
from rayspec.twin._profile import AcceptanceProfile
from rayspec.twin._profile import NoiseProfile
from rayspec.twin._profile import Profile
from rayspec.twin._profile import load_profile
from tests.helpers import without_noise

PROFILE = load_profile("kimi-k2.5-tp8-pcie")


def _with_acceptance(profile: Profile, acceptance: AcceptanceProfile) -> Profile:
    """``profile`` with another drafter acceptance shape."""
    drafter = dataclasses.replace(profile.drafter, acceptance=acceptance)
    return dataclasses.replace(profile, drafter=drafter)


FLAT_77 = _with_acceptance(PROFILE, AcceptanceProfile(kind="flat", a=0.77))
TUNED_ENV = dict(FIELD_TUNED_NCCL)
TUNED = resolve_nccl(TUNED_ENV, PROFILE)
UNTUNED = resolve_nccl({}, PROFILE)


def chain(k: int) -> SpecSettings:
    return SpecSettings("EAGLE3", k, 1, k + 1)


def model(
    nccl: NcclSetup = TUNED, spec: SpecSettings | None = None, profile: Profile = PROFILE
) -> PerfModel:
    return PerfModel(profile, nccl, spec)


# ------------------------------------------------------------------- worked arithmetic


def test_baseline_tuned() -> None:
    m = model()
    assert m.step_ms(1) == pytest.approx(8.255 + 124 * 0.0245, abs=1e-9)  # 11.293 ms
    assert m.step_ms(1) == pytest.approx(11.293, abs=5e-4)
    assert m.expected_tok_s() == pytest.approx(88.55, abs=0.01)


def test_baseline_untuned() -> None:
    m = model(UNTUNED)
    assert m.step_ms(1) == pytest.approx(15.836, abs=5e-4)
    assert m.expected_tok_s() == pytest.approx(63.15, abs=0.01)


def test_verify_tuned() -> None:
    assert model().expected_experts(3) == pytest.approx(23.50, abs=0.005)
    assert model().expected_experts(6) == pytest.approx(45.57, abs=0.005)
    assert TUNED.allreduce_us(6 * 14336) == pytest.approx(27.13, abs=0.005)
    assert model(spec=chain(2)).verify_ms() == pytest.approx(18.980, abs=5e-4)
    assert model(spec=chain(5)).verify_ms() == pytest.approx(21.396, abs=5e-4)


def test_draft_tuned() -> None:
    assert model(spec=chain(2)).draft_ms() == pytest.approx(0.718 + 2 * (0.030 + 3 * 0.0245))
    assert model(spec=chain(2)).draft_ms() == pytest.approx(0.925, abs=5e-4)
    assert model(spec=chain(5)).draft_ms() == pytest.approx(1.236, abs=5e-4)


def test_cycle_and_tok_s_tuned() -> None:
    k2, k5 = model(spec=chain(2)), model(spec=chain(5))
    assert k2.step_ms(1) == pytest.approx(19.905, abs=5e-4)
    assert k5.step_ms(1) == pytest.approx(22.631, abs=5e-4)
    assert k2.expected_accept_length() == pytest.approx(1.88984, abs=5e-6)
    assert k5.expected_accept_length() == pytest.approx(1.96588, abs=5e-6)
    assert k2.expected_tok_s() == pytest.approx(94.94, abs=0.01)
    assert k5.expected_tok_s() == pytest.approx(86.87, abs=0.01)


def test_untuned_arithmetic() -> None:
    assert UNTUNED.allreduce_us(43008) == pytest.approx(46.5 + 13.72 + 2.76, abs=0.01)
    assert UNTUNED.allreduce_us(86016) == pytest.approx(65.73, abs=0.005)
    assert UNTUNED.allreduce_us(14336) == pytest.approx(61.14, abs=0.005)
    k2, k5 = model(UNTUNED, chain(2)), model(UNTUNED, chain(5))
    assert (k2.draft_ms() - 0.718) / 2 == pytest.approx(0.213, abs=5e-4)  # one draft step
    assert k2.verify_ms() == pytest.approx(23.751, abs=5e-4)
    assert k2.step_ms(1) == pytest.approx(24.896, abs=5e-4)
    assert k2.expected_tok_s() == pytest.approx(75.91, abs=0.01)
    assert k5.verify_ms() == pytest.approx(26.182, abs=5e-4)
    assert k5.step_ms(1) == pytest.approx(27.967, abs=5e-4)
    assert k5.expected_tok_s() == pytest.approx(70.29, abs=0.01)
    assert k5.draft_ms() == pytest.approx(1.79, abs=0.005)


def test_expected_experts_and_acceptance_by_depth() -> None:
    m = model()
    assert [round(m.expected_experts(t), 1) for t in range(1, 7)] == [
        8.0,
        15.8,
        23.5,
        31.0,
        38.4,
        45.6,
    ]
    assert m.expected_experts(128) == pytest.approx(358, abs=0.5)
    assert m.expected_experts(384) == pytest.approx(384, abs=0.5)
    a = model(spec=chain(5)).acceptance()
    assert [round(x, 3) for x in a] == [0.635, 0.401, 0.254, 0.160, 0.101]


def test_shares_and_reported_acceptance() -> None:
    k2, k5 = model(spec=chain(2)), model(spec=chain(5))
    assert k2.draft_ms() / k2.step_ms(1) == pytest.approx(0.046, abs=0.001)
    assert k5.draft_ms() / k5.step_ms(1) == pytest.approx(0.055, abs=0.001)
    assert k5.verify_ms() / k5.step_ms(1) == pytest.approx(0.945, abs=0.001)
    # The accept rate as reported: (L - 1) / k.
    assert (k2.expected_accept_length() - 1) / 2 == pytest.approx(0.445, abs=0.001)
    assert (k5.expected_accept_length() - 1) / 5 == pytest.approx(0.193, abs=0.001)


# ----------------------------------------------------------------------------- step sweep

SWEEP_UNTUNED = [68.6, 75.9, 75.4, 72.9, 70.3, 67.9, 65.6, 63.6, 61.7, 59.9]
SWEEP_TUNED = [85.7, 94.9, 94.0, 90.5, 86.9, 83.5, 80.5, 77.7, 75.1, 72.8]
SWEEP_L = [1.635, 1.890, 1.954, 1.965, 1.966, 1.966, 1.966, 1.966, 1.966, 1.966]


@pytest.mark.parametrize("k", range(1, 11))
def test_step_sweep(k: int) -> None:
    assert model(UNTUNED, chain(k)).expected_tok_s() == pytest.approx(
        SWEEP_UNTUNED[k - 1], abs=0.051
    )
    assert model(TUNED, chain(k)).expected_tok_s() == pytest.approx(SWEEP_TUNED[k - 1], abs=0.051)
    assert model(spec=chain(k)).expected_accept_length() == pytest.approx(SWEEP_L[k - 1], abs=5e-4)


@pytest.mark.parametrize("nccl", [TUNED, UNTUNED], ids=["tuned", "untuned"])
def test_sweep_optimum_is_two_steps(nccl: NcclSetup) -> None:
    speeds = {k: model(nccl, chain(k)).expected_tok_s() for k in range(1, 11)}
    assert max(speeds, key=speeds.__getitem__) == 2
    baseline = model(nccl).expected_tok_s()
    gain = speeds[2] / baseline - 1
    assert gain == pytest.approx(0.20 if nccl is UNTUNED else 0.07, abs=0.01)


# ----------------------------------------------------------------------------- tree rows

TREE_ROWS = [
    # k, topk, N, L ref, cycle ms, tok/s ref, L flat 0.77, tok/s flat 0.77
    (3, 1, 4, 1.95, 20.79, 94.0, 2.82, 135.6),
    (3, 2, 4, 2.02, 20.79, 97.1, 2.82, 135.6),
    (3, 2, 6, 2.21, 22.42, 98.5, 2.96, 131.9),
    (3, 4, 6, 2.23, 22.43, 99.4, 2.96, 131.9),
    (3, 4, 8, 2.38, 24.01, 98.9, 3.07, 127.8),
    (3, 8, 16, 2.75, 29.92, 91.9, 3.38, 113.1),
]


@pytest.mark.parametrize("row", TREE_ROWS, ids=[f"k{r[0]}-m{r[1]}-N{r[2]}" for r in TREE_ROWS])
def test_tree_rows(row: tuple[int, int, int, float, float, float, float, float]) -> None:
    k, topk, n, l_ref, cycle, tok_ref, l_flat, tok_flat = row
    spec = SpecSettings("EAGLE3", k, topk, n)
    ref, flat = model(spec=spec), model(spec=spec, profile=FLAT_77)
    assert ref.expected_accept_length() == pytest.approx(l_ref, abs=0.0051)
    assert ref.step_ms(1) == pytest.approx(cycle, abs=0.0051)
    assert ref.expected_tok_s() == pytest.approx(tok_ref, abs=0.051)
    assert flat.expected_accept_length() == pytest.approx(l_flat, abs=0.0051)
    assert flat.expected_tok_s() == pytest.approx(tok_flat, abs=0.051)


def test_tree_with_topk_one_equals_chain() -> None:
    a = model(spec=chain(4)).acceptance()
    tree = build_draft_tree(a, topk=1, num_draft_tokens=5, theta=0.34)
    assert tree.expected_tokens == pytest.approx(model(spec=chain(4)).expected_accept_length())
    assert tree.nodes == {(1,), (1, 1), (1, 1, 1), (1, 1, 1, 1)}


def test_tree_is_closed_under_ancestors() -> None:
    tree = model(spec=SpecSettings("EAGLE3", 4, 4, 12)).draft_tree()
    assert len(tree.nodes) == 11
    for node in tree.nodes:
        assert all(node[:i] in tree.nodes for i in range(1, len(node)))


def test_budget_violation_is_not_evaluated() -> None:
    bad = SpecSettings("EAGLE3", 2, 2, 16)  # 15 > 2 + 1*4 = 6 candidates
    assert not tree_fits(bad)
    assert tree_fits(SpecSettings("EAGLE3", 2, 2, 7))
    m = model(spec=bad)  # construction succeeds: the server starts, the first decode fails
    with pytest.raises(DraftTreeError, match="selected index k out of range") as info:
        m.step_ms(1)
    assert info.value.reason is FailureReason.INVALID_DRAFT_TREE
    with pytest.raises(DraftTreeError):
        m.expected_accept_length()
    with pytest.raises(DraftTreeError):
        m.sample_cycle_tokens(random.Random(0), 1.0)


def test_spec_must_be_normalised() -> None:
    with pytest.raises(ValueError, match="num_steps \\+ 1"):
        model(spec=SpecSettings("EAGLE3", 3, 1, 8))
    with pytest.raises(ValueError, match=">= 1"):
        model(spec=SpecSettings("EAGLE3", 0, 1, 1))


# ---------------------------------------------------------------------------- concurrency

CONCURRENCY = [
    # B, no spec, k=2 ref, k=5 flat 0.77, t_AR decode, t_AR verify (N=3)
    (1, 89, 95, 152, 24, 24),
    (4, 296, 281, 390, 25, 33),
    (16, 707, 633, 840, 37, 70),
    (32, 984, 927, 1232, 54, 119),
    (64, 1357, 1359, 1692, 87, 218),
    (128, 1922, 1865, 2092, 152, 414),
]


@pytest.mark.parametrize("row", CONCURRENCY, ids=[f"B{r[0]}" for r in CONCURRENCY])
def test_concurrency(row: tuple[int, int, int, int, int, int]) -> None:
    b, base, k2, k5_flat, ar_decode, ar_verify = row
    ctx = 1000.0
    assert b * model().expected_tok_s(b, ctx) == pytest.approx(base, rel=0.05)
    assert b * model(spec=chain(2)).expected_tok_s(b, ctx) == pytest.approx(k2, rel=0.05)
    assert b * model(spec=chain(5), profile=FLAT_77).expected_tok_s(b, ctx) == pytest.approx(
        k5_flat, rel=0.05
    )
    assert TUNED.allreduce_us(b * 14336) == pytest.approx(ar_decode, rel=0.05)
    assert TUNED.allreduce_us(b * 3 * 14336) == pytest.approx(ar_verify, rel=0.05)


def test_high_concurrency_with_nccl_choosing() -> None:
    env = {"NCCL_PROTO": "LL,LL128,Simple", "NCCL_P2P_LEVEL": "SYS", "NCCL_GRAPH_FILE": "g.xml"}
    nccl = resolve_nccl(env, PROFILE)
    assert 128 * model(nccl).expected_tok_s(128, 1000) == pytest.approx(2087, rel=0.01)
    assert 128 * model(nccl, chain(2)).expected_tok_s(128, 1000) == pytest.approx(2187, rel=0.01)


# ---------------------------------------------------------------------- stronger drafters


@pytest.mark.parametrize(
    ("a", "k", "length", "tok_s"),
    [
        (0.70, 5, 2.94, 130.0),
        (0.70, 6, 3.06, 130.0),
        (0.75, 5, 3.29, 145.3),
        (0.75, 6, 3.47, 147.3),
        (0.75, 7, 3.60, 147.4),
        (0.80, 8, 4.33, 171.1),
    ],
)
def test_stronger_drafters(a: float, k: int, length: float, tok_s: float) -> None:
    m = model(spec=chain(k), profile=_with_acceptance(PROFILE, AcceptanceProfile("flat", a=a)))
    assert m.expected_accept_length() == pytest.approx(length, abs=0.006)
    assert m.expected_tok_s() == pytest.approx(tok_s, abs=0.051)


def test_flat_acceptance_matches_closed_form() -> None:
    a, k = 0.75, 6
    m = model(spec=chain(k), profile=_with_acceptance(PROFILE, AcceptanceProfile("flat", a=a)))
    assert m.expected_accept_length() == pytest.approx((1 - a ** (k + 1)) / (1 - a))


def test_acceptance_mult_and_cap() -> None:
    m = model(spec=chain(3))
    assert m.acceptance(1.2)[0] == pytest.approx(0.635 * 1.2)
    assert m.acceptance(2.0)[0] == pytest.approx(0.99)  # a_cap
    assert m.expected_accept_length(1.1) > m.expected_accept_length(1.0)
    assert model().expected_accept_length(1.5) == 1.0


# ----------------------------------------------- the field table (tok/s avg), docs/twin-model.md

FIELD = [
    # name, env, steps, measured avg, measured peak
    ("baseline tuned", TUNED_ENV, None, 88.8, 89.0),
    ("baseline default", {}, None, 62.9, 63.0),
    ("EAGLE-3 5 steps default", {}, 5, 71.3, 75.3),
    ("EAGLE-3 5 steps tuned", TUNED_ENV, 5, 86.7, 94.0),
    ("EAGLE-3 2 steps tuned", TUNED_ENV, 2, 94.0, 96.9),
]


def _field_model(env: dict[str, str], steps: int | None) -> PerfModel:
    return model(resolve_nccl(env, PROFILE), None if steps is None else chain(steps))


@pytest.mark.parametrize("row", FIELD, ids=[r[0] for r in FIELD])
def test_field_table_expected(row: tuple[str, dict[str, str], int | None, float, float]) -> None:
    _, env, steps, avg, _ = row
    assert _field_model(env, steps).expected_tok_s() == pytest.approx(avg, rel=0.05)
    # The fit is much tighter than 5 %: every figure within 1.5 %.
    assert _field_model(env, steps).expected_tok_s() == pytest.approx(avg, rel=0.015)


def _simulate_run(m: PerfModel, noise: NoiseModel, rng: random.Random, tokens: int) -> float:
    """tok/s of one request: per-request noise draw, per-cycle token draws, truncation."""
    mult, time_factor = noise.draw_request()
    cycle_ms = m.step_ms(1, mult=mult) * time_factor * noise.start_factor
    produced = cycles = 0
    while produced < tokens:
        produced += m.sample_cycle_tokens(rng, mult)
        cycles += 1
    return 1000.0 * tokens / (cycles * cycle_ms)


@pytest.mark.parametrize("row", FIELD, ids=[r[0] for r in FIELD])
def test_field_table_simulated(row: tuple[str, dict[str, str], int | None, float, float]) -> None:
    """Seeded server starts x 5 runs of 500-token requests, noise on: mean and peak of 5."""
    _, env, steps, avg, peak = row
    m = _field_model(env, steps)
    means, peaks = [], []
    for seed in range(40):
        rng = random.Random(seed)
        noise = NoiseModel(PROFILE.noise, rng, speculative=steps is not None)
        runs = [_simulate_run(m, noise, rng, 500) for _ in range(5)]
        means.append(statistics.mean(runs))
        peaks.append(max(runs))
    assert statistics.mean(means) == pytest.approx(avg, rel=0.05)
    assert statistics.mean(peaks) == pytest.approx(peak, rel=0.05)


# --------------------------------------------------------------------- per-cycle sampling


@pytest.mark.parametrize(
    ("spec", "mult"),
    [(chain(2), 1.0), (chain(5), 1.0), (chain(5), 0.8), (chain(3), 1.3)]
    + [(SpecSettings("EAGLE3", r[0], r[1], r[2]), 1.0) for r in TREE_ROWS[1:]],
    ids=lambda v: v.label() if isinstance(v, SpecSettings) else f"mult={v}",
)
def test_sampled_cycles_reproduce_expected_length(spec: SpecSettings, mult: float) -> None:
    m = model(spec=spec)
    rng = random.Random(1234)
    n = 20000
    draws = [m.sample_cycle_tokens(rng, mult) for _ in range(n)]
    assert min(draws) >= 1
    assert max(draws) <= spec.num_steps + 1
    expected = m.expected_accept_length(mult)
    stderr = statistics.pstdev(draws) / n**0.5
    assert statistics.mean(draws) == pytest.approx(expected, abs=4 * stderr)


def test_sampling_without_spec_and_reproducibility() -> None:
    assert model().sample_cycle_tokens(random.Random(0), 1.3) == 1
    m = model(spec=SpecSettings("EAGLE3", 3, 4, 8))
    r1, r2 = random.Random(9), random.Random(9)
    assert [m.sample_cycle_tokens(r1, 1.0) for _ in range(200)] == [
        m.sample_cycle_tokens(r2, 1.0) for _ in range(200)
    ]


# ----------------------------------------------------------------- forward-pass details


def test_context_term() -> None:
    m = model()
    per_request = 61 * 1152 * 1000 / 1.41e9  # 1000 extra tokens of KV, ms
    assert m.forward_ms(1, 1, 2000) - m.forward_ms(1, 1, 1000) == pytest.approx(per_request)
    assert m.forward_ms(4, 4, 2000) - m.forward_ms(4, 4, None) == pytest.approx(4 * per_request)
    assert m.forward_ms(1, 1, 500) < m.forward_ms(1, 1)  # signed around ctx_cal


def test_compute_floor_takes_over_near_890_tokens() -> None:
    m = model()
    f = PROFILE.forward

    def expert_term(t: int) -> float:
        return f.W0_ms + f.c_e_ms * (m.expected_experts(t) - 8)

    assert f.flop_tok_ms * 880 < expert_term(880)
    assert f.flop_tok_ms * 900 > expert_term(900)


def test_dense_profile_has_no_expert_term() -> None:
    dense = dataclasses.replace(PROFILE, model=dataclasses.replace(PROFILE.model, moe=None))
    m = PerfModel(dense, resolve_nccl(TUNED_ENV, dense), None)
    assert m.expected_experts(6) == 0.0
    # Extra tokens cost only p_tok and collectives: verify of 6 is nearly free at batch 1.
    extra = m.forward_ms(6, 1) - m.forward_ms(1, 1)
    coll = 124 * (TUNED.allreduce_us(6 * 14336) - TUNED.allreduce_us(14336)) / 1000
    assert extra == pytest.approx(5 * 0.08 + coll)


def test_prefill_placeholder() -> None:
    m = model()
    assert 60 <= m.prefill_ms(100) <= 110
    assert m.prefill_ms(1000) > m.prefill_ms(100)
    assert m.prefill_ms(0) == PROFILE.uncalibrated.prefill_base_ms


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        model().forward_ms(0, 1)
    with pytest.raises(ValueError, match="no speculative"):
        model().verify_ms()
    with pytest.raises(ValueError, match="no speculative"):
        model().draft_ms()


# ---------------------------------------------------------------------------------- noise


def test_noise_is_reproducible() -> None:
    a = NoiseModel(PROFILE.noise, random.Random(42))
    b = NoiseModel(PROFILE.noise, random.Random(42))
    assert a.start_factor == b.start_factor
    assert [a.draw_request() for _ in range(50)] == [b.draw_request() for _ in range(50)]
    assert a.start_factor != 1.0


def test_noise_off_is_exactly_one() -> None:
    noise = NoiseModel(NoiseProfile.off(), random.Random(1))
    assert noise.start_factor == 1.0
    assert noise.start_offset == 0.0
    assert all(noise.draw_request() == RequestNoise(1.0, 1.0) for _ in range(20))
    quiet = NoiseModel(without_noise(PROFILE).noise, random.Random(1))
    assert quiet.draw_request() == (1.0, 1.0)


def test_noise_without_speculation_keeps_mult_one() -> None:
    noise = NoiseModel(PROFILE.noise, random.Random(3), speculative=False)
    draws = [noise.draw_request() for _ in range(200)]
    assert all(d.mult == 1.0 for d in draws)
    assert statistics.pstdev([d.time_factor for d in draws]) == pytest.approx(0.003, rel=0.25)


def test_noise_distribution_and_floor() -> None:
    noise = NoiseModel(PROFILE.noise, random.Random(11))
    mults = [noise.draw_request().mult for _ in range(4000)]
    assert statistics.mean(mults) == pytest.approx(1.0, abs=0.005)
    assert statistics.pstdev(mults) == pytest.approx(0.056, rel=0.1)
    wide = NoiseProfile(sigma_time=0.0, sigma_accept=0.5, accept_floor=0.5, sigma_start=0.0)
    many = NoiseModel(wide, random.Random(2))
    floor = [many.draw_request().mult for _ in range(500)]
    assert min(floor) == 0.5
    assert statistics.pstdev(
        [NoiseModel(PROFILE.noise, random.Random(s)).start_factor for s in range(2000)]
    ) == pytest.approx(0.01, rel=0.1)
