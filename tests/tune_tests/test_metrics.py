"""The study's Ray metrics: one update per finished trial, a no-op without Ray's metrics."""

from __future__ import annotations

import math
import types

from rayspec._types import Candidate
from rayspec._types import TrialRecord
from rayspec._types import TrialResult
from rayspec._types import TrialState
from rayspec.tune._metrics import StudyMetrics


class _Metric:
    def __init__(self, name: str, description: str = "", tag_keys: tuple[str, ...] = ()) -> None:
        self.name, self.tag_keys = name, tag_keys
        self.calls: list[tuple[str, float, dict[str, str]]] = []

    def _check(self, tags: dict[str, str]) -> None:
        if set(tags) != set(self.tag_keys):  # as Ray: every declared tag, no other
            raise ValueError(f"{self.name}: tags {sorted(tags)} != {sorted(self.tag_keys)}")

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        self._check(tags or {})
        self.calls.append(("inc", value, dict(tags or {})))

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        self._check(tags or {})
        self.calls.append(("set", value, dict(tags or {})))


def _fake() -> tuple[types.ModuleType, dict[str, _Metric]]:
    made: dict[str, _Metric] = {}

    def factory(name: str, **kwargs: object) -> _Metric:
        made[name] = _Metric(name, **kwargs)  # type: ignore[arg-type]
        return made[name]

    module = types.ModuleType("fake_metrics")
    module.Counter = factory  # type: ignore[attr-defined]
    module.Gauge = factory  # type: ignore[attr-defined]
    return module, made


def _result(n: int, state: TrialState, tok_s: float = math.nan, failure: str | None = None):
    return TrialResult(
        trial=n, state=state, value=tok_s if state is TrialState.COMPLETE else None,
        candidate=Candidate(), launch=None, requests=(), start_unix_s=1.0, end_unix_s=2.0,
        metrics={"tok_s_mean": tok_s, "accept_length": 2.1}, failure=failure,
    )  # fmt: skip


def test_one_call_per_trial_updates_every_metric() -> None:
    module, made = _fake()
    records = [TrialRecord(_result(0, TrialState.COMPLETE, 70.0)),
               TrialRecord(_result(3, TrialState.COMPLETE, 99.0),
                           note="reused the measurement of trial 0")]  # fmt: skip
    metrics = StudyMetrics("s", budget=14, records=records, module=module)
    assert metrics.best_tok_s == 70.0  # a reused row is not a measurement
    metrics.trial_done(_result(1, TrialState.COMPLETE, 91.5), restarts=2)
    metrics.trial_done(_result(2, TrialState.FAIL, failure="wrong_output"), restarts=3)
    metrics.trial_done(_result(3, TrialState.COMPLETE, 88.0), restarts=4)
    assert [c[2]["state"] for c in made["rayspec_trials_total"].calls] == [
        "COMPLETE", "FAIL", "COMPLETE"]  # fmt: skip
    assert made["rayspec_failures_total"].calls == [
        ("inc", 1.0, {"study": "s", "reason": "wrong_output"})]  # fmt: skip
    assert made["rayspec_restarts"].calls[-1][1] == 4.0
    assert made["rayspec_restart_budget"].calls[-1][1] == 14.0
    assert [(c[2]["trial"], c[1]) for c in made["rayspec_trial_tok_s"].calls] == [
        ("1", 91.5), ("3", 88.0)]  # fmt: skip
    assert made["rayspec_trial_accept_length"].calls[0][1] == 2.1
    assert made["rayspec_best_tok_s"].calls[-1][1] == 91.5


def test_without_ray_every_call_is_a_no_op(monkeypatch) -> None:
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # as in a simulated study
    metrics = StudyMetrics("s", budget=3)
    metrics.trial_done(_result(0, TrialState.COMPLETE, 60.0), restarts=1)
    assert metrics.best_tok_s == 60.0 and metrics._metrics is None


def test_a_broken_metrics_module_never_fails_the_study() -> None:
    module = types.ModuleType("broken")
    metrics = StudyMetrics("s", budget=3, module=module)  # no Counter: creation fails
    metrics.trial_done(_result(0, TrialState.COMPLETE, 60.0), restarts=1)
    metrics.trial_done(_result(1, TrialState.COMPLETE, 61.0), restarts=2)
    assert metrics.best_tok_s == 61.0


def test_the_real_ray_metrics_accept_our_names_and_tags(ray_cluster) -> None:
    metrics = StudyMetrics("s", budget=3)
    metrics.trial_done(_result(0, TrialState.COMPLETE, 60.0), restarts=1)
    metrics.trial_done(_result(1, TrialState.FAIL, failure="out_of_memory"), restarts=2)
    assert metrics._metrics is not None and not metrics._disabled
