"""The report as Markdown: the study, the pick and its launch command, the field-style table,
the failures, and the plots with how to read them."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

from rayspec._types import TrialState
from rayspec.report._categories import category_lines
from rayspec.report._escape import md_cell
from rayspec.report._load import plan_verdict_of
from rayspec.results import ABOVE_PEAK_WHY
from rayspec.results import VERDICT_HEADER
from rayspec.results import PlanVerdict
from rayspec.results import above_peak
from rayspec.results import cost_line
from rayspec.results import gains
from rayspec.results import interval
from rayspec.results import pareto_data
from rayspec.results import plan_recommended
from rayspec.results import speculation_gain
from rayspec.results import tie_note
from rayspec.results import verdict_rows
from rayspec.results import vs_baseline
from rayspec.results import within_noise
from rayspec.store import StudyFolder

if TYPE_CHECKING:
    from rayspec.report._load import StudyData
    from rayspec.report._plots import Plot
    from rayspec.results import Row

__all__ = [
    "ABOVE_PEAK_MARK",
    "failure_lines",
    "pareto_table",
    "render",
    "table_rows",
    "trial_span",
]

ABOVE_PEAK_MARK = "†"  # after an estimate above its row's own peak; the footnote says why


def _cell(text: str) -> str:
    return md_cell(text)


def _flags(data: StudyData, row: Row) -> list[str]:
    report = data.report
    flags = []
    if report.best is not None and row.trials == report.best.trials:
        flags.append("**picked**")
    if (
        report.fastest is not None
        and report.best is not None
        and row.trials == report.fastest.trials
        and report.fastest.trials != report.best.trials
    ):
        flags.append("best estimate, not picked")  # fmt: skip
    if row.role:
        flags.append(row.role)
    if not row.feasible:
        flags.append("misses the SLO")
    if within_noise(row, report.baseline):
        flags.append("within noise of the baseline")
    by_trial = {r.trial: r for r in data.records}
    measured = [by_trial[t] for t in row.trials if t in by_trial]
    pruned = [r.trial for r in measured if r.result.state is TrialState.PRUNED]
    if pruned:
        flags.append("pruned: trial " + ", ".join(str(t) for t in pruned))
    if row.reused_by:
        flags.append("reused by trial " + ", ".join(str(t) for t in row.reused_by))
    if row.alarm or any(r.alarm for r in measured):
        flags.append("acceptance alarm")
    return flags


def table_rows(data: StudyData) -> list[dict[str, Any]]:
    """The table as data, one entry per configuration, then one per failed trial (the report
    renders these; tests compare them with the trial rows)."""
    report = data.report
    out: list[dict[str, Any]] = []
    for row in report.rows:
        half = 1.96 * row.sd * row.tok_s_mean
        out.append({
            "trials": row.trials,
            "config": row.label,
            "tok_s": row.tok_s_mean,
            "ci95": half if math.isfinite(half) else math.nan,
            "peak": row.tok_s_peak,
            "accept_length": row.accept_length,
            "starts": row.starts,
            "runs": row.runs,
            "vs_baseline": vs_baseline(row, report.baseline),
            "flags": _flags(data, row),
            "above_peak": above_peak(row),
        })  # fmt: skip
    # Failed trials of one configuration, role and reason are one entry: a broken install
    # fails every launch alike (201 identical rows before).
    failed: dict[tuple[str, str, str], list[int]] = {}
    for trial, label, reason in report.failures:
        failed.setdefault((label, data.roles.get(trial, ""), reason), []).append(trial)
    for (label, role, reason), trials in failed.items():
        out.append({
            "trials": tuple(trials), "config": label, "tok_s": math.nan, "ci95": math.nan,
            "peak": math.nan, "accept_length": math.nan, "starts": 0, "runs": 0,
            "vs_baseline": "—", "above_peak": False,
            "flags": [r for r in (role,) if r] + [f"failed: {reason}"],
        })  # fmt: skip
    return out


def trial_span(trials: Sequence[int]) -> str:
    """Trial numbers as runs of consecutive ones: ``3, 5-200``.

    Example:
        >>> trial_span([5, 3, 6, 7, 9])
        '3, 5-7, 9'
    """
    spans: list[list[int]] = []
    for t in sorted(set(trials)):
        if spans and t == spans[-1][1] + 1:
            spans[-1][1] = t
        else:
            spans.append([t, t])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def failure_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The Failures section's lines: failed trials with the same reason and message are one
    line (their trials as spans, how many), the message escaped and cut."""
    groups: dict[tuple[str, str], list[int]] = {}
    for r in rows:
        if r["state"] != "FAIL" or not r.get("failure_detail"):
            continue
        detail = (str(r["failure_detail"]).splitlines() or [""])[0]
        groups.setdefault((str(r.get("failure") or "unknown"), detail), []).append(int(r["trial"]))
    lines = []
    for (reason, detail), trials in groups.items():
        which = f"trial {trials[0]}" if len(trials) == 1 else (
            f"trials {trial_span(trials)} ({len(trials)} alike)"
        )  # fmt: skip
        lines.append(f"- {which} ({reason}): {md_cell(detail, 300)}")
    return lines


def _num(value: float, fmt: str = ".1f") -> str:
    return format(value, fmt) if math.isfinite(value) else "—"


def _table(data: StudyData) -> list[str]:
    lines = [
        "| trials | config | tok/s (± 95 % CI) | tok/s peak | accept len | starts x runs "
        "| vs baseline | flags |",
        "|---|---|---|---|---|---|---|---|",
    ]
    entries = table_rows(data)
    for e in entries:
        many = len(e["trials"]) > 3  # a group of failed trials: as spans
        trials = trial_span(e["trials"]) if many else ",".join(str(t) for t in e["trials"])
        if math.isfinite(e["tok_s"]):
            tok = _num(e["tok_s"]) + (ABOVE_PEAK_MARK if e["above_peak"] else "")
            tok += f" ± {e['ci95']:.1f}" if math.isfinite(e["ci95"]) else ""
            starts = f"{e['starts']} x {e['runs'] // max(1, e['starts'])}"
        else:
            tok, starts = "—", "—"
        lines.append(
            f"| {trials} | {_cell(e['config'])} | {tok} | {_num(e['peak'])} | "
            f"{_num(e['accept_length'], '.2f')} | {starts} | {e['vs_baseline']} | "
            f"{_cell(', '.join(e['flags']))} |"
        )
    if any(e["above_peak"] for e in entries):
        lines += ["", f"{ABOVE_PEAK_MARK} {ABOVE_PEAK_WHY[0].upper()}{ABOVE_PEAK_WHY[1:]}."]
    return lines


def _gains(data: StudyData) -> list[str]:
    """What each change bought against the baseline, as the field's own table shows it, then
    what speculation bought on the pick's NCCL set (against no speculation there)."""
    lines = [
        "| change | configuration | tok/s (± 95 % CI) | ratio (95 % CI) | against |",
        "|---|---|---|---|---|",
    ]
    for g in (*gains(data.report), speculation_gain(data.report)):
        if g.row is None:
            lines.append(f"| {g.what} | not measured ({_cell(g.missing)}) | — | — | — |")
            continue
        low, high = interval(g.row)
        tok = _num(g.row.tok_s_mean)
        tok += f" ± {(high - low) / 2:.1f}" if math.isfinite(low) else ""
        vs = (
            f"{g.ratio:.2f}x ({g.low:.2f}-{g.high:.2f})"
            if math.isfinite(g.low)
            else (f"{g.ratio:.2f}x" if math.isfinite(g.ratio) else "—")
        )
        which = "trial" if len(g.row.trials) == 1 else "trials"
        trials = ", ".join(str(t) for t in g.row.trials)
        lines.append(
            f"| {g.what} | {which} {trials}: {_cell(g.row.label)} | {tok} | {vs} | "
            f"{_cell(g.reference)} |"
        )
    return lines


def _zero_goodput(data: StudyData) -> str:
    """The launched, completed trials no configuration row holds: measured to goodput 0."""
    shown = {t for row in data.report.rows for t in row.trials}
    zero = [
        r for r in data.records
        if r.launched and r.result.state is TrialState.COMPLETE and r.trial not in shown
        and r.result.metrics.get("goodput") == 0.0
    ]  # fmt: skip
    return "; ".join(f"trial {r.trial} ({_cell(r.candidate.label())})" for r in zero)


def pareto_table(data: StudyData) -> list[str]:
    """The Pareto table's lines (none when no configuration was measured)."""
    points, slo = pareto_data(data.records, data.concurrency, int(data.attrs.get("tp_size") or 1))
    if not points:
        return []
    lines = [
        "| trials | config | load | tok/s per GPU | tok/s per user | front |"
        + (" meets SLO |" if slo else ""),
        "|---|---|---|---|---|---|" + ("---|" if slo else ""),
    ]
    for p in sorted(points, key=lambda p: (not p.on_front, -p.tok_s_per_gpu, -p.user_tok_s)):
        conc = data.concurrency.get(p.scenario)
        load = p.scenario + (f" (concurrency {conc})" if conc else "")
        lines.append(
            f"| {','.join(map(str, p.trials))} | {_cell(p.label)} | {_cell(load)} | "
            f"{_num(p.tok_s_per_gpu, '.2f')} | {_num(p.user_tok_s)} | "
            f"{'**front**' if p.on_front else ''} |"
            + ((" yes |" if p.feasible else " no |") if slo else "")
        )
    return lines


def _engine_line(data: StudyData) -> str:
    attrs = data.attrs
    engine = str(attrs.get("engine") or next(
        (r["engine"] for r in data.rows if r.get("engine")), "unknown"))  # fmt: skip
    version = attrs.get("sglang_version")
    if engine == "twin":
        what = ", ".join(
            ([f"profile {attrs['twin_profile']}"] if attrs.get("twin_profile") else [])
            + ([f"SGLang {version}"] if version else [])
        )
        text = "twin — a SIMULATED SGLang node" + (f" ({what})" if what else "")
        text += ": the numbers are the model's"
    else:
        text = engine + (f" {version}" if version else "")
        if attrs.get("model_path"):
            text += f", model {attrs['model_path']}"
    return text


def _summary(data: StudyData) -> list[str]:
    report = data.report
    states = [str(r["state"]) for r in data.rows]
    budget = data.attrs.get("max_restarts")
    restarts = f"{report.restarts}" + (f" of a budget of {budget}" if budget else "")
    lines = [
        f"- engine: {_engine_line(data)}",
        f"- server restarts: {restarts}; trials: {report.total} ({states.count('COMPLETE')} "
        f"complete, {report.failed} failed, {report.pruned} pruned, {report.reused} reused "
        "a measurement)",
    ]
    if data.attrs.get("bench"):
        lines.append(f"- benchmark: {data.attrs['bench']}")
    if data.attrs.get("slo"):
        lines.append(f"- SLO (p99 over each trial's requests, ms): {data.attrs['slo']}")
    if str(data.attrs.get("objective", "")).startswith("goodput"):
        lines.append(
            "- objective: goodput (output tok/s of the requests that met the SLO): the "
            "configuration table's tok/s are goodput"
        )
    best, base = report.best, report.baseline
    if best is None:
        lines.append("- pick: none (no configuration completed)")
        return lines
    half = 1.96 * best.sd * best.tok_s_mean
    text = f"- **pick: {best.label}**: {best.tok_s_mean:.1f}"
    text += f" ± {half:.1f} tok/s" if math.isfinite(half) else " tok/s"
    starts = "one server start" if best.starts == 1 else f"{best.starts} server starts pooled"
    which = "trial" if len(best.trials) == 1 else "trials"
    text += f" ({starts}, {which} {', '.join(str(t) for t in best.trials)})"
    if base is not None and best.trials != base.trials:
        text += f", {vs_baseline(best, base)} vs the baseline ({base.tok_s_mean:.1f} tok/s)"
    lines.append(text)
    if report.pick_note:
        lines.append(f"- {report.pick_note}")
    tied = tie_note(report, data.margin)
    if tied:
        lines.append(f"- {tied[0].upper()}{tied[1:]}")
    return lines


def _launch_count(row: dict[str, Any]) -> int | None:
    value = row.get("restart")
    return int(value) if isinstance(value, int | float) and math.isfinite(value) else None


def _restarts(data: StudyData) -> list[str]:
    """``## Why each restart``: every server launch, in order, with the search's reason (the
    belief search's names the three starts worth most, with their means and sds)."""
    launched = sorted(
        (r for r in data.rows if _launch_count(r) is not None),
        key=lambda r: (_launch_count(r), int(r["trial"])),
    )
    if not launched:
        return []
    lines = ["", "## Why each restart", "", "| restart | trial | configuration | why |",
             "|---|---|---|---|"]  # fmt: skip
    for r in launched:
        why = r.get("reason") or r.get("role") or ""
        lines.append(
            f"| {_launch_count(r)} | {r['trial']} | {_cell(str(r.get('candidate') or ''))} | "
            f"{_cell(str(why))} |"
        )
    return lines


def plan_section(data: StudyData) -> list[str]:
    """``## The per-load plan``: the plan against the static pick and no speculation, per load
    (empty when no plan was verified)."""
    verdict = plan_verdict_of(data)
    if verdict is None:
        return []
    trials = ", ".join(map(str, verdict.trials))
    lines = ["", "## The per-load plan", ""]
    lines.append(
        f"One server for every load: `{_cell(verdict.plan.candidate().label())}` (SGLang's "
        f"adaptive tiers, `--speculative-adaptive-config adaptive_tiers.json`), verified by "
        f"trial {trials} at every load, beside the static pick and the best "
        "configuration without speculation. Each figure is throughput (tok/s, whatever "
        "`study.objective` is) with its 95 % interval (the "
        "runs' spread and one server start's offset, `study.start_noise`, per start); "
        "`plan - static` carries the noise of the difference."
    )
    lines += ["", "| " + " | ".join(VERDICT_HEADER) + " |", "|" + "---|" * len(VERDICT_HEADER)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in verdict_rows(verdict)]
    cost = cost_line(verdict)
    why = verdict.why
    lines += ["", f"**{why[0].upper()}{why[1:]}.**", "", f"{cost[0].upper()}{cost[1:]}."]
    lines += ["", deploy_line(verdict)]
    return lines


def deploy_line(verdict: PlanVerdict) -> str:
    """Which file launches which option: ``best.sh`` is always the recommendation."""
    if plan_recommended(verdict):
        return (
            "Deploy: `best.sh` launches the plan (the launch command above); `best-static.sh` "
            "the static pick."
        )
    return (
        "Deploy: `best.sh` launches the static pick (the launch command above); "
        "`best-adaptive.sh` the plan."
    )


def render(data: StudyData, plots: Sequence[Plot], report_dir: str) -> str:
    """The whole ``report.md``; plot paths are written relative to ``report_dir``."""
    lines = [f"# Study {data.name}", ""]
    lines += _summary(data)
    lines += ["", "## Best launch command", ""]
    if data.launch:
        lines += [f"From {data.launch_source}:", "", "```bash", data.launch.rstrip("\n"), "```"]
    else:
        lines.append("No configuration completed: nothing to launch.")
    lines += ["", "## Configurations", ""]
    lines.append(
        "One row per configuration, every server start of it pooled, best estimate first. "
        "`tok/s` is the estimate the pick uses, with its 95 % interval; `starts x runs` says "
        "what it rests on; failed trials follow with their reason."
    )
    lines += [""] + _table(data)
    zero = _zero_goodput(data)
    if zero:
        lines += ["", "Measured, but no request met the SLO (goodput 0, never picked): " + zero]
    if data.report.best is not None:
        lines += ["", "## What each change bought", ""]
        lines.append(
            "Against the baseline, as the field's own table shows it: the NCCL set alone "
            "(speculation off), speculation on the baseline's NCCL, and the joint pick; then "
            "what speculation bought the pick: the pick against the best configuration "
            "measured without speculation on the same NCCL set. Each ratio's 95 % interval "
            "holds both estimates' uncertainty."
        )
        lines += [""] + _gains(data)
    lines += _restarts(data)
    lines += plan_section(data)
    pareto = pareto_table(data)
    if pareto:
        gpus = int(data.attrs.get("tp_size") or 1)
        lines += ["", "## Throughput against interactivity", ""]
        lines.append(
            f"Each configuration at each load: output tok/s per GPU (the server's over its "
            f"{gpus} GPUs) against tok/s per user (a request's decode rate after its first "
            "token), both means over the configuration's trials. **front** marks the Pareto "
            "front: no other point is at least as good on both and better on one."
        )
        lines += [""] + pareto
    failures = failure_lines(data.rows)
    if failures:
        lines += ["", "## Failures", ""] + failures
    lines += category_lines(data)  # only for a prompt set of several categories
    lines += ["", "## Plots", ""]
    for plot in plots:
        lines += [f"### {plot.title}", ""]
        if plot.path:
            rel = os.path.relpath(plot.path, report_dir)
            lines += [f"![{plot.title}]({rel})", "", plot.caption]
        else:
            lines.append(f"Not drawn: {plot.skipped}.")
        lines.append("")
    folder = StudyFolder(data.path)
    lines += [
        "## Data",
        "",
        f"- trials: `{folder.trials}/` (Parquet, one file per trial, one schema)",
        f"- requests: `{folder.requests}/`",
    ]
    if data.categories:
        lines.append(f"- per prompt category: `{folder.categories}/` (one row per category)")
    if data.study is not None:
        lines.append(f"- Optuna study `{data.name}`: `{folder.journal}`")
    elif data.study_note:
        lines.append(f"- Optuna study: {data.study_note}")
    return "\n".join(lines) + "\n"
