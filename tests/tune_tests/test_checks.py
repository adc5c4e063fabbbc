"""The correctness gate and the acceptance alarm (pure), and the gate in a study."""

from __future__ import annotations

import math

from rayspec import Candidate
from rayspec import RequestRecord
from rayspec import SpecSettings
from rayspec.tune._checks import Chain
from rayspec.tune._checks import OutputGate
from rayspec.tune._checks import acceptance_alarm
from rayspec.tune._checks import judge
from rayspec.tune._checks import reference_outputs


def _key(scenario: str, run: int, index: int) -> str:
    return f"{scenario}/{run}/{index}"


def _rec(run: int, ids: list[int]) -> RequestRecord:
    return RequestRecord(
        scenario="c1", run=run, index=0, concurrency=1, prompt_tokens=10,
        completion_tokens=len(ids), ttft_ms=1.0, e2e_ms=10.0, itl_ms=(), start_unix_s=0.0,
        output_ids=tuple(ids),
    )  # fmt: skip


BASE = [list(range(100 * r, 100 * r + 64)) for r in range(4)]


def test_identical_outputs_pass_and_late_drift_passes() -> None:
    ref = reference_outputs([_rec(r, ids) for r, ids in enumerate(BASE)], _key)
    same = judge([_rec(r, ids) for r, ids in enumerate(BASE)], ref, _key, gate_tokens=32)
    assert same is not None and not same.wrong and same.diverged_early == 0
    assert same.median_divergence == 64
    late = [ids[:50] + [9] * 14 for ids in BASE]  # a near-tie flips at token 50: drift
    v = judge([_rec(r, ids) for r, ids in enumerate(late)], ref, _key, gate_tokens=32)
    assert v is not None and not v.wrong and v.median_divergence == 50


def test_early_divergence_in_most_outputs_is_wrong() -> None:
    ref = reference_outputs([_rec(r, ids) for r, ids in enumerate(BASE)], _key)
    garbled = [ids[:6] + [7] * 58 for ids in BASE[:3]] + [BASE[3]]
    v = judge([_rec(r, ids) for r, ids in enumerate(garbled)], ref, _key, gate_tokens=32)
    assert v is not None and v.wrong and (v.compared, v.diverged_early) == (4, 3)
    assert "3 of 4 outputs differ" in v.describe(32, 0)


def test_nothing_to_compare_is_no_verdict() -> None:
    ref = reference_outputs([_rec(0, BASE[0])], _key)
    assert judge([_rec(7, BASE[0])], ref, _key, gate_tokens=32) is None


def test_a_drifting_engine_turns_the_gate_off() -> None:
    gate = OutputGate(_key, gate_tokens=32)
    gate.set_reference(0, [_rec(r, ids) for r, ids in enumerate(BASE)])
    assert gate.check_drift([_rec(r, ids) for r, ids in enumerate(BASE)]) == ""
    assert gate.enabled
    line = gate.check_drift([_rec(r, [1] + ids[1:]) for r, ids in enumerate(BASE)])
    assert "not deterministic enough" in line and not gate.enabled
    assert gate.judge([_rec(0, [5] * 64)]) is None  # off: no verdicts


def test_the_alarm_fires_far_below_the_best_chain_or_the_expectation() -> None:
    chains = [Chain(3, 2, 1.89, 94.0), Chain(4, 3, 1.95, 93.0)]
    deep = Candidate(spec=SpecSettings("EAGLE3", 3, 4, 6))
    hint = acceptance_alarm(deep, 1.2, chains)
    assert "trial 3, the best chain" in hint and "eagle_aux_hidden_state_layer_ids" in hint
    assert acceptance_alarm(deep, 1.8, chains) == ""
    shallow = Candidate(spec=SpecSettings("EAGLE3", 1, 1, 2))
    assert acceptance_alarm(shallow, 1.2, chains) == ""  # one step cannot reach 1.89
    assert "study.expect_accept_length" in acceptance_alarm(shallow, 1.2, [], expected=1.9)
    assert acceptance_alarm(Candidate(), math.nan, chains) == ""
