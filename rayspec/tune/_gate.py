"""The correctness gate as the study runs it: its reference (the baseline's outputs, a resumed
study's too) and its verdict on each measured trial (:class:`~rayspec.tune._checks.OutputGate`
holds the comparison itself)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from collections.abc import Sequence

from rayspec._config import ExperimentConfig
from rayspec._exceptions import FailureReason
from rayspec._types import TrialRecord
from rayspec._types import TrialResult
from rayspec._types import TrialState
from rayspec.bench import request_input
from rayspec.results import GATE_UNCHECKED
from rayspec.search import TrialHandle
from rayspec.search._study import ROLE_BASELINE_AGAIN
from rayspec.store import ParquetTrialStore
from rayspec.store import StudyFolder
from rayspec.store import request_record
from rayspec.tune._checks import OutputGate
from rayspec.tune._checks import prompt_key
from rayspec.tune._trial import bench_plan

__all__ = ["awaits_reference", "check_output", "make_gate"]

Printer = Callable[[str], None]


def make_gate(
    cfg: ExperimentConfig,
    store: ParquetTrialStore,
    roles: dict[int, str],
    records: Sequence[TrialRecord],
    printer: Printer,
) -> OutputGate:
    """The correctness gate, with the baseline's outputs when a resumed study has them."""
    scenarios = {sc.name: sc for sc in bench_plan(cfg).scenarios}

    @functools.lru_cache(maxsize=4096)
    def key_of(scenario: str, run: int, index: int) -> str:
        ask = request_input(scenarios[scenario], run, index)
        return prompt_key(ask.prompt, ask.max_tokens)

    gate = OutputGate(key_of, gate_tokens=cfg.bench.gate_tokens, enabled=cfg.bench.check_outputs)
    measured = {
        r.trial for r in records
        if r.result.state is TrialState.COMPLETE and r.run_values and not r.reused
    }  # fmt: skip
    # The latest measured baseline start (an interrupted one's retry holds the baseline role).
    baseline = max((n for n, r in roles.items() if r == "baseline" and n in measured),
                   default=None)  # fmt: skip
    if gate.enabled and baseline is not None:
        table = store.load_requests()
        rows = [r for r in table.to_pylist() if int(r["trial"]) == baseline]
        ok = [request_record(r) for r in rows if r["scenario"] in scenarios]
        gate.set_reference(baseline, ok)
        if not gate.reference:
            printer(f"correctness gate: the baseline's (trial {baseline}) outputs are not in "
                    f"{StudyFolder(cfg.out_dir).requests}: later trials cannot be compared and "
                    "will not be picked; restore that file or start a new study")  # fmt: skip
    return gate


def awaits_reference(gate: OutputGate, trial: TrialHandle, result: TrialResult) -> bool:
    """Whether ``result`` has outputs to compare and the gate has no reference for them yet.

    With several slots a trial may finish before the baseline whose outputs it is compared
    with; judged at once it would be unchecked and never picked (a hand-tuned floor then no
    longer guards the pick). The driver records it once the baseline's outputs are in.
    """
    return (
        gate.enabled
        and not gate.reference
        and trial.role not in ("baseline", ROLE_BASELINE_AGAIN)
        and result.state in (TrialState.COMPLETE, TrialState.PRUNED)
        and bool(result.requests)
    )


def check_output(
    gate: OutputGate, trial: TrialHandle, result: TrialResult, printer: Printer
) -> TrialResult:
    """The correctness gate on a measured trial: the baseline sets the reference, its second
    start checks the engine's drift, every other trial is compared (wrong_output fails it)."""
    if result.state not in (TrialState.COMPLETE, TrialState.PRUNED) or not result.requests:
        return result
    if trial.role == "baseline":
        gate.set_reference(result.trial, result.requests)
        return result
    if trial.role == ROLE_BASELINE_AGAIN:
        line = gate.check_drift(result.requests)
        if line:
            printer(f"correctness gate: {line}")
        return result
    verdict = gate.judge(result.requests)
    if verdict is None:
        if not gate.enabled:  # bench.check_outputs=false, or turned off (said when it was)
            return result
        # On, with nothing to compare against: said in the row and the progress, and never
        # picked (build_report), rather than passing as if checked.
        why = gate.unchecked_reason()
        printer(f"correctness gate: trial {result.trial}'s outputs were not compared ({why}); "
                "it will not be picked")  # fmt: skip
        return dataclasses.replace(
            result,
            metrics=dict(result.metrics) | {GATE_UNCHECKED: 1.0},
            failure_detail=f"outputs not compared by the correctness gate: {why}",
        )
    metrics = dict(result.metrics)
    metrics["gate_compared"] = float(verdict.compared)
    metrics["gate_diverged_early"] = float(verdict.diverged_early)
    if not verdict.wrong:
        return dataclasses.replace(result, metrics=metrics)
    assert gate.reference_trial is not None
    return dataclasses.replace(
        result,
        state=TrialState.FAIL,
        value=None,
        metrics=metrics,
        failure=FailureReason.WRONG_OUTPUT,
        failure_detail=verdict.describe(gate.gate_tokens, gate.reference_trial),
    )
