"""Decisions from one trial's runs: the pruning rule and the comparison columns."""

from __future__ import annotations

import math

from rayspec import Candidate
from rayspec import SpecSettings
from rayspec.results import cost_key
from rayspec.tune._decide import Measured
from rayspec.tune._decide import cannot_beat
from rayspec.tune._decide import comparison_metrics

INCUMBENT = [94.0, 95.1, 93.8, 96.9, 94.3]  # spread like the field's 2-step runs


def _m(trial: int, runs: list[float], steps: int | None = None, topk: int = 1) -> Measured:
    spec = None if steps is None else SpecSettings("EAGLE3", steps, topk, steps + 1)
    return Measured(trial, Candidate(spec=spec), tuple(runs))


def test_clearly_worse_is_pruned_after_one_run() -> None:
    assert cannot_beat([70.3], INCUMBENT)  # the 5-step untuned level
    assert cannot_beat([63.1], INCUMBENT)  # the untuned baseline


def test_close_or_better_is_not_pruned() -> None:
    assert not cannot_beat([92.0], INCUMBENT)  # within the incumbent's noise
    assert not cannot_beat([99.0], INCUMBENT)
    assert not cannot_beat([94.0, 95.0], INCUMBENT)


def test_no_incumbent_spread_no_pruning() -> None:
    assert not cannot_beat([10.0], [94.0])  # one incumbent run: no noise estimate
    assert not cannot_beat([], INCUMBENT)
    assert not cannot_beat([70.0], INCUMBENT, min_runs=2)


def test_own_spread_is_pooled() -> None:
    # A noisy trial: its own spread keeps it alive even though its mean is lower.
    assert not cannot_beat([70.0, 100.0], INCUMBENT)
    # A consistent one with the same mean is clearly below.
    assert cannot_beat([85.0, 85.2], INCUMBENT)


def test_comparison_metrics_names_and_values() -> None:
    out = comparison_metrics("vs_baseline", INCUMBENT, [88.8, 88.7, 89.0, 88.9, 88.6], 0.05)
    assert set(out) == {
        "vs_baseline_ratio", "vs_baseline_ci95_low", "vs_baseline_ci95_high",
        "vs_baseline_p", "vs_baseline_significant",
    }  # fmt: skip
    assert math.isclose(out["vs_baseline_ratio"], 94.82 / 88.8, rel_tol=1e-3)
    assert out["vs_baseline_ci95_low"] < out["vs_baseline_ratio"] < out["vs_baseline_ci95_high"]
    assert out["vs_baseline_significant"] == 1.0 and out["vs_baseline_p"] < 0.01


def test_cost_key_orders_draft_tokens_then_steps() -> None:
    assert cost_key(Candidate()) == (0, 0)
    assert cost_key(Candidate(spec=SpecSettings("EAGLE3", 2, 1, 3))) == (3, 2)
    assert cost_key(Candidate(spec=SpecSettings("EAGLE3", 3, 2, 3))) == (3, 3)
