"""The study's end on the terminal: the configuration table in the field's form, and the risks
of deploying the pick that its speed does not show. The table and the pick themselves are
:mod:`rayspec.results`' own.
"""

from __future__ import annotations

import math

from rayspec._config import ExperimentConfig
from rayspec._plural import plural
from rayspec.results import ABOVE_PEAK_WHY
from rayspec.results import Row
from rayspec.results import StudyReport
from rayspec.results import above_peak
from rayspec.results import gains
from rayspec.results import speculation_gain
from rayspec.results import vs_baseline

__all__ = ["ABOVE_PEAK_MARK", "deploy_warnings", "format_gains", "format_table", "no_pick_line"]

# After an estimate above its row's own peak; the note under the table says why.
ABOVE_PEAK_MARK = "*"


def deploy_warnings(row: Row) -> list[str]:
    """Risks of deploying ``row`` that its speed does not show."""
    notes = []
    proto = row.candidate.env.get("NCCL_PROTO", "")
    if "ll128" in proto.lower() and not proto.startswith("^"):
        notes.append(
            "NCCL_PROTO lists LL128: NCCL honours it on PCIe although LL128 relies on 128-byte "
            "store ordering it only assumes on NVLink (silent corruption reported in NVIDIA/nccl "
            "PR #2053). On a PCIe node, prefer the fastest configuration without LL128."
        )
    return notes


def format_table(report: StudyReport, limit: int = 10) -> str:
    """The field table's form, one row per configuration, best estimate first.

    ``tok/s`` is the estimate the pick uses (all starts pooled); ``starts x runs`` says how much
    it rests on. An estimate above its own peak is marked (:data:`ABOVE_PEAK_MARK`) and a note
    under the table says why; a last line says how many configurations were left out.
    """
    shown = list(report.rows[:limit])
    for extra in (r for r in report.rows if r.role and r not in shown):
        shown.append(extra)
    if report.best is not None and report.best not in shown:
        shown.append(report.best)
    lines = [
        "| trials | config | tok/s | tok/s peak | accept len | starts x runs | vs baseline |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in shown:
        tag = f" ({r.role})" if r.role else ""
        if report.best is not None and r.trials == report.best.trials:
            tag += " (picked)"
        if r.alarm:
            tag += " (acceptance alarm)"
        if r.reused_by:
            more = "…" if len(r.reused_by) > 4 else ""
            which = "trial" if len(r.reused_by) == 1 else "trials"
            tag += f" (reused by {which} {', '.join(str(t) for t in r.reused_by[:4])}{more})"
        acc = f"{r.accept_length:.2f}" if math.isfinite(r.accept_length) else "—"
        trials = ",".join(str(t) for t in r.trials[:4]) + ("…" if len(r.trials) > 4 else "")
        vs = vs_baseline(r, report.baseline, noise=True)
        mark = ABOVE_PEAK_MARK if above_peak(r) else ""
        lines.append(
            f"| {trials} | {r.label}{tag} | {r.tok_s_mean:.1f}{mark} | {r.tok_s_peak:.1f} | {acc} "
            f"| {r.starts} x {r.runs // max(1, r.starts)} | {vs} |"
        )
    for trial, label, reason in report.failures[:5]:
        lines.append(f"| {trial} | {label} | failed: {reason} | | | | |")
    if len(report.failures) > 5:
        lines.append(f"| … | {len(report.failures) - 5} more failed trials | | | | | |")
    left_out = len(report.rows) - len(shown)
    if left_out:
        which = "configuration" if left_out == 1 else "configurations"
        lines.append(f"… {left_out} more {which} in report.md")
    if any(above_peak(r) for r in shown):
        lines.append(f"{ABOVE_PEAK_MARK} {ABOVE_PEAK_WHY}")
    return "\n".join(lines)


def format_gains(report: StudyReport) -> list[str]:
    """What each change bought against the baseline, one line each (the field table's
    decomposition: NCCL alone, speculation on top, the joint pick), then what speculation
    bought on the pick's own NCCL set."""
    return [g.describe() for g in (*gains(report), speculation_gain(report))]


def no_pick_line(cfg: ExperimentConfig, report: StudyReport, measured: int, logs: str) -> str:
    """Why no configuration was picked, as it happened: nothing ran to its end, or trials ran
    and measured nothing (``measured``: the trials that completed or were pruned)."""
    if not measured:
        return (
            "no trial completed: see the failure reasons in the trials table and the logs in "
            f"{logs}"
        )
    ran = f"{plural(measured, 'trial')} ran to the end ({report.failed} failed)"
    if cfg.study.objective == "goodput" and cfg.study.slo:
        slo = ", ".join(f"{k} {v:g}" for k, v in cfg.study.slo.items())
        return (
            f"no configuration picked: {ran}, but no request of any met study.slo ({slo}), so "
            "each measured a goodput of 0 tok/s; loosen study.slo, or set "
            "study.objective=tok_s_mean to rank by throughput"
        )
    return (
        f"no configuration picked: {ran}, but none measured a positive {cfg.study.objective}; "
        f"see the trials table and the logs in {logs}"
    )
