"""The report's PNG plots, drawn with matplotlib's Agg canvas (no display, no pyplot state).

Each plot function takes the study and a target path and returns a :class:`Plot`; a plot that
does not apply (no speculative trial, one scenario, too few trials for importances) returns one
with ``skipped`` set to the reason instead, which the report prints in its place.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Any

from rayspec._atomic import write_atomic
from rayspec._plural import plural
from rayspec._types import Candidate
from rayspec.results import pareto_data

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from rayspec.report._load import StudyData
    from rayspec.results import Row

__all__ = [
    "PLOTS",
    "Plot",
    "draw_plots",
    "grouped_importances",
    "moved_together",
    "one_trial_only",
    "bar_label",
    "short_label",
]

PICK_COLOR = "#d62728"
BASELINE_COLOR = "#555555"
_DPI = 110


@dataclass(frozen=True)
class Plot:
    """One plot of the report.

    Attributes:
        name: the file name under ``plots/`` (also the plot's id).
        title: a heading for the report.
        caption: how to read it.
        path: the PNG written ("" when skipped).
        skipped: why it was not drawn ("" when drawn).
    """

    name: str
    title: str
    caption: str = ""
    path: str = ""
    skipped: str = ""


def short_label(candidate: Candidate, width: int = 56) -> str:
    """A configuration's label short enough for an axis: at most ``width`` characters, never
    cut inside a setting; NCCL variables and flags that do not fit are counted (``+2 more``).

    Example:
        >>> from rayspec._types import SpecSettings
        >>> nccl = (("NCCL_ALGO", "Ring"), ("NCCL_BUFFSIZE", "16777216"), ("NCCL_PROTO", "LL"))
        >>> short_label(Candidate(nccl, SpecSettings("EAGLE3", 2, 1, 3)), 40)
        '2 steps/topk 1/3 tok; ALGO=Ring +2 more'
    """
    spec = candidate.spec
    if spec is None:
        head = "no spec"
    elif spec.adaptive:
        head = f"adaptive from {plural(spec.num_steps, 'step')}"
    else:
        steps = plural(spec.num_steps, "step")
        head = f"{steps}/topk {spec.eagle_topk}/{spec.num_draft_tokens} tok"
    words = [f"{k.removeprefix('NCCL_')}={v}" for k, v in candidate.nccl_env] or ["NCCL default"]
    words += candidate.server_settings
    for keep in range(len(words), -1, -1):
        more = f" +{len(words) - keep} more" if keep < len(words) else ""
        text = f"{head}; {' '.join(words[:keep])}".rstrip() + more
        if len(text) <= width:
            return text
    return head[: width - 1] + "…"


def _name(path: str) -> str:
    return os.path.basename(path)


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=_DPI, layout="constrained")


def _save(fig: Figure, path: str) -> str:
    """Write the figure as ``path`` under the study folder (``plots/``'s parent): never
    through a link."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return write_atomic(path, buf.getvalue(), root=os.path.dirname(os.path.dirname(path)))


def _ci(row: Row) -> float:
    """Half the 95 % interval of the pick's estimate (tok/s)."""
    half = 1.96 * row.sd * row.tok_s_mean
    return half if math.isfinite(half) else 0.0


def _same(a: Row, b: Row | None) -> bool:
    return b is not None and a.trials == b.trials


def _baseline_line(ax: Axes, data: StudyData, *, vertical: bool = False) -> None:
    base = data.report.baseline
    if base is None or not math.isfinite(base.tok_s_mean):
        return
    label = f"baseline {base.tok_s_mean:.1f} tok/s"
    if vertical:
        ax.axvline(base.tok_s_mean, color=BASELINE_COLOR, ls="--", lw=1.2, label=label)
    else:
        ax.axhline(base.tok_s_mean, color=BASELINE_COLOR, ls="--", lw=1.2, label=label)


# -- optimization history -------------------------------------------------------------------------
def plot_history(data: StudyData, path: str) -> Plot:
    title = "Optimization history"
    caption = (
        "Each server restart's measured tok/s (trial order), and the pick after it (its "
        "estimate: all starts of a configuration pooled); the dashed line is the baseline."
    )
    launched = sorted(
        (r for r in data.rows if r.get("restart") is not None and r.get("command")),
        key=lambda r: (float(r["restart"]), int(r["trial"])),
    )
    if not launched:
        return Plot(_name(path), title, caption, skipped="no trial started a server")
    fig = _figure(8.0, 4.2)
    ax = fig.add_subplot()
    groups: dict[str, tuple[list[float], list[float]]] = {
        "COMPLETE": ([], []), "PRUNED": ([], []), "FAIL": ([], []),
    }  # fmt: skip
    measured = [_f(r.get("tok_s_mean")) for r in launched]
    floor = min((v for v in measured if math.isfinite(v)), default=0.0) * 0.95
    for r in launched:
        value = _f(r.get("tok_s_mean"))
        state = str(r["state"])
        if state == "FAIL" or not math.isfinite(value):
            state, value = "FAIL", floor
        groups.setdefault(state, ([], []))
        groups[state][0].append(float(r["restart"]))
        groups[state][1].append(value)
    style = {
        "COMPLETE": dict(marker="o", color="#1f77b4", label="measured trial"),
        "PRUNED": dict(marker="o", color="#1f77b4", mfc="none", label="pruned (stopped early)"),
        "FAIL": dict(marker="x", color=PICK_COLOR, label="failed (no throughput)"),
    }
    for state, (xs, ys) in groups.items():
        if xs:
            ax.plot(xs, ys, ls="none", ms=6, **style.get(state, {}))  # type: ignore[arg-type]
    xs_pick, ys_pick = [], []
    for r in launched:
        best = data.report_at(int(r["trial"])).best
        if best is not None:
            xs_pick.append(float(r["restart"]))
            ys_pick.append(best.tok_s_mean)
    if xs_pick:
        ax.step(xs_pick, ys_pick, where="post", color="#2ca02c", lw=2, label="pick so far")
    _baseline_line(ax, data)
    best = data.report.best
    if best is not None:
        restarts = [float(r["restart"]) for r in launched if int(r["trial"]) in best.trials]
        if restarts:
            ax.plot(
                [max(restarts)], [best.tok_s_mean], marker="*", ms=16, color=PICK_COLOR,
                ls="none", label=f"pick: {best.tok_s_mean:.1f} tok/s",
            )  # fmt: skip
    ax.set_xlabel("server restarts (launches)")
    ax.set_ylabel("output tok/s")
    ax.set_title(f"{data.name}: tok/s per restart and the pick")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    return Plot(_name(path), title, caption, path=_save(fig, path))


def _f(value: Any) -> float:
    try:
        return float(value) if value is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


# -- every run of the top configurations ----------------------------------------------------------
def _run_values(data: StudyData, row: Row) -> list[float]:
    by_trial = {r.trial: r for r in data.records}
    return [
        v for t in row.trials if t in by_trial for v in by_trial[t].run_values if math.isfinite(v)
    ]


def plot_runs(data: StudyData, path: str, limit: int = 12) -> Plot:
    title = "Every run of the best configurations"
    caption = (
        "Dots: every measured run (all server starts); bar: the estimate the pick uses with its "
        "95 % interval; the pick in red; the dashed line is the baseline."
    )
    report = data.report
    shown = [r for r in report.rows if r.ok][:limit]
    for extra in (report.best, report.baseline):
        if extra is not None and extra not in shown and extra.ok:
            shown.append(extra)
    if not shown:
        return Plot(_name(path), title, caption, skipped="no configuration was measured")
    fig = _figure(8.0, 1.2 + 0.38 * len(shown))
    ax = fig.add_subplot()
    import numpy as np

    rng = np.random.default_rng(0)
    for y, row in enumerate(shown):
        picked = _same(row, report.best)
        color = PICK_COLOR if picked else "#1f77b4"
        runs = _run_values(data, row)
        if runs:
            jitter = rng.uniform(-0.15, 0.15, len(runs))
            ax.plot(runs, y + jitter, ls="none", marker=".", ms=4, alpha=0.45, color=color)
        ax.errorbar(
            [row.tok_s_mean], [y], xerr=[[_ci(row)], [_ci(row)]], fmt="*" if picked else "o",
            ms=12 if picked else 6, color=color, capsize=3,
        )  # fmt: skip
    ax.set_yticks(range(len(shown)))
    ax.set_yticklabels(
        [short_label(r.candidate) + (" (pick)" if _same(r, report.best) else "") for r in shown],
        fontsize=7,
    )
    ax.invert_yaxis()
    _baseline_line(ax, data, vertical=True)
    ax.set_xlabel("output tok/s per run")
    ax.set_title("runs per configuration (best estimate first)")
    ax.grid(axis="x", alpha=0.3)
    if report.baseline is not None:
        ax.legend(loc="lower right", fontsize=8)
    return Plot(_name(path), title, caption, path=_save(fig, path))


# -- steps x topk ---------------------------------------------------------------------------------
def _speculative(row: Row) -> bool:
    spec = row.candidate.spec
    return spec is not None and not spec.adaptive and row.ok


def _cells(data: StudyData, anchor: Row) -> dict[tuple[int, int], Row]:
    """(topk, steps) -> the best speculative configuration there with ``anchor``'s NCCL class
    and flags."""
    cells: dict[tuple[int, int], Row] = {}
    for row in data.report.rows:
        spec = row.candidate.spec
        if (
            not _speculative(row)
            or spec is None
            or row.candidate.server_settings != anchor.candidate.server_settings
        ):
            continue
        if not data.same_nccl(row.candidate, anchor.candidate):
            continue
        key = (spec.eagle_topk, spec.num_steps)
        if key not in cells or row.tok_s_mean > cells[key].tok_s_mean:
            cells[key] = row
    return cells


def plot_steps_topk(data: StudyData, path: str) -> Plot:
    """The pick's NCCL set (its screen class); when the pick is not speculative or its set
    holds a single speculative configuration, the set with the most of them."""
    report = data.report
    title = "tok/s over steps × topk"
    spec_rows = [r for r in report.rows if _speculative(r)]
    if not spec_rows:
        return Plot(_name(path), title, skipped="no speculative configuration was measured")
    pick = report.best
    anchor = pick if pick is not None and _speculative(pick) else spec_rows[0]
    cells = _cells(data, anchor)
    why = "the pick's NCCL set" if anchor is pick else "the NCCL set of the best speculative one"
    if len(cells) < 2:
        widest = max(spec_rows, key=lambda r: (len(_cells(data, r)), r.tok_s_mean))
        if len(_cells(data, widest)) > len(cells):
            anchor, cells = widest, _cells(data, widest)
            why = "the NCCL set with the most speculative configurations measured"
    nccl = " ".join(f"{k}={v}" for k, v in anchor.candidate.nccl_env) or "NCCL default"
    caption = (
        f"Speculative configurations measured with {why} ({nccl}, and the sets the NCCL screen "
        "found equivalent): per cell the best estimate over the draft-token budgets (tok/s, gain "
        "over the baseline, draft tokens); grey cells were not measured; the pick is framed "
        "in red."
    )
    topks = sorted({k for k, _ in cells})
    steps = sorted({s for _, s in cells})
    import numpy as np

    grid = np.full((len(topks), len(steps)), np.nan)
    for (k, s), row in cells.items():
        grid[topks.index(k), steps.index(s)] = row.tok_s_mean
    fig = _figure(1.6 + 1.05 * len(steps), 1.6 + 0.85 * len(topks))
    ax = fig.add_subplot()
    from matplotlib import colormaps
    from matplotlib.patches import Rectangle

    cmap = colormaps["viridis"].with_extremes(bad="#dddddd")
    image = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, aspect="auto", origin="lower")
    base = report.baseline.tok_s_mean if report.baseline is not None else math.nan
    finite = grid[np.isfinite(grid)]
    middle = float(finite.mean()) if finite.size else 0.0
    for (k, s), row in cells.items():
        y, x = topks.index(k), steps.index(s)
        spec = row.candidate.spec
        text = f"{row.tok_s_mean:.1f}"
        if math.isfinite(base) and base > 0:
            text += f"\n{(row.tok_s_mean / base - 1) * 100:+.0f} %"
        text += f"\n{spec.num_draft_tokens if spec else '?'} tok"
        ax.text(x, y, text, ha="center", va="center", fontsize=7,
                color="white" if row.tok_s_mean < middle else "black")  # fmt: skip
        if _same(row, report.best):
            ax.add_patch(Rectangle((x - 0.5, y - 0.5), 1, 1, fill=False, ec=PICK_COLOR, lw=3))
    ax.set_xticks(range(len(steps)), [str(s) for s in steps])
    ax.set_yticks(range(len(topks)), [str(k) for k in topks])
    xlabel = "speculative steps (num_steps)"
    if math.isfinite(base):  # in the label, which the layout makes room for, not over it
        xlabel += f"\nbaseline: {base:.1f} tok/s"
    ax.set_xlabel(xlabel)
    ax.set_ylabel("eagle_topk")
    import textwrap

    short = " ".join(f"{k.removeprefix('NCCL_')}={v}" for k, v in anchor.candidate.nccl_env)
    ax.set_title(textwrap.fill(f"output tok/s; NCCL: {short or 'default'}", 56), fontsize=9)
    bar = fig.colorbar(image, ax=ax)
    bar.set_label("output tok/s")
    if math.isfinite(base):
        low, high = bar.ax.get_ylim()
        if low <= base <= high:
            bar.ax.axhline(base, color=BASELINE_COLOR, ls="--", lw=2)
    return Plot(_name(path), title, caption, path=_save(fig, path))


# -- accept length --------------------------------------------------------------------------------
def plot_accept_length(data: StudyData, path: str) -> Plot:
    title = "Accept length against steps"
    caption = (
        "Mean accepted tokens per verify step of each speculative configuration (all NCCL "
        "sets: acceptance does not depend on NCCL), by topk; the dashed line is the most a "
        "draft of that depth can give (steps + 1), the dotted one decoding without "
        "speculation (1); the pick is the red star."
    )
    report = data.report
    points = [
        r for r in report.rows
        if _speculative(r) and math.isfinite(r.accept_length) and r.candidate.spec is not None
    ]  # fmt: skip
    if not points:
        return Plot(_name(path), title, caption,
                    skipped="no speculative configuration reported an accept length")  # fmt: skip
    fig = _figure(7.0, 4.2)
    ax = fig.add_subplot()
    topks = sorted({r.candidate.spec.eagle_topk for r in points if r.candidate.spec})
    for i, k in enumerate(topks):
        sel = [r for r in points if r.candidate.spec and r.candidate.spec.eagle_topk == k]
        offset = (i - (len(topks) - 1) / 2) * 0.08
        ax.plot(
            [r.candidate.spec.num_steps + offset for r in sel if r.candidate.spec],
            [r.accept_length for r in sel], ls="none", marker="o", ms=6, alpha=0.8,
            label=f"topk {k}",
        )  # fmt: skip
    steps = sorted({r.candidate.spec.num_steps for r in points if r.candidate.spec})
    ax.plot(steps, [s + 1 for s in steps], ls="--", color=BASELINE_COLOR, lw=1,
            label="upper bound: steps + 1")  # fmt: skip
    ax.axhline(1.0, color=BASELINE_COLOR, ls=":", lw=1.2, label="no speculation: 1")
    best = report.best
    if best is not None and best.candidate.spec is not None and math.isfinite(best.accept_length):
        ax.plot([best.candidate.spec.num_steps], [best.accept_length], marker="*", ms=16,
                color=PICK_COLOR, ls="none", label=f"pick: {best.accept_length:.2f}")  # fmt: skip
    ax.set_xlabel("speculative steps (num_steps)")
    ax.set_ylabel("accept length (tokens per verify step)")
    ax.set_xticks(steps)
    ax.set_title("acceptance by draft depth")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return Plot(_name(path), title, caption, path=_save(fig, path))


# -- parameter importances ------------------------------------------------------------------------
def _determines(pairs: list[tuple[Any, Any]]) -> bool:
    """Whether the first value fixes the second in every pair (a function of it)."""
    seen: dict[str, Any] = {}
    for a, b in pairs:
        key = repr(a)
        if seen.setdefault(key, b) != b:
            return False
    return True


def moved_together(names: list[str], trials: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """``names`` in groups the search always moved together: two parameters are one group
    when, over ``trials`` (each one's parameters; an absent one is None), each one's value
    fixes the other's (perfectly correlated, categorical or not). Their importances cannot be
    told apart. Groups keep the order of ``names`` (a lone parameter is a group of one)."""
    groups: list[list[str]] = []
    for name in names:
        for group in groups:
            head = group[0]
            pairs = [(t.get(head), t.get(name)) for t in trials]
            varies = len({repr(a) for a, _ in pairs}) > 1
            if varies and _determines(pairs) and _determines([(b, a) for a, b in pairs]):
                group.append(name)
                break
        else:
            groups.append([name])
    return [tuple(g) for g in groups]


def grouped_importances(
    importances: dict[str, float], trials: list[dict[str, Any]]
) -> dict[str, float]:
    """One entry per :func:`moved_together` group (``a + b``: the members' sum, what the
    group explains together), most important first."""
    groups = moved_together(list(importances), trials)
    merged = {" + ".join(g): sum(importances[n] for n in g) for g in groups}
    return dict(sorted(merged.items(), key=lambda kv: -kv[1]))


def one_trial_only(name: str, trials: dict[int, dict[str, Any]]) -> tuple[int, ...]:
    """The trials whose value of ``name`` (a :func:`grouped_importances` name: its first
    member) no other trial shares, when no two values were each measured twice: the
    parameter's share is then those trials' differences, everything else they set included
    (trial 1's four NCCL variables, the baseline's NCCL defaults), nothing to act on. Empty
    when two of its values were each measured in two trials or more.

    Args:
        trials: each completed trial's number -> its parameters (an absent one is None).
    """
    head = name.split(" + ")[0]
    by_value: dict[str, list[int]] = {}
    for number, params in sorted(trials.items()):
        by_value.setdefault(repr(params.get(head)), []).append(number)
    if sum(1 for numbers in by_value.values() if len(numbers) > 1) >= 2:
        return ()
    return tuple(sorted(n for numbers in by_value.values() if len(numbers) == 1 for n in numbers))


def plot_importances(data: StudyData, path: str) -> Plot:
    title = "Parameter importances"
    caption = (
        "Optuna's own evaluator (optuna.importance.get_param_importances) over the study's "
        "completed trials: the share of tok/s variation each parameter explains. A failed "
        "configuration is a completed trial at 0 tok/s in the study, so it counts too. Only "
        "parameters with two values each measured in two trials or more have a bar: what to "
        "tune next."
    )
    study = data.study
    if study is None:
        return Plot(_name(path), title, caption, skipped=data.study_note or "no study")
    importances = study.importances  # evaluated where the study was read (rayspec.search)
    if importances is None:
        return Plot(_name(path), title, caption, skipped=study.importance_note)
    if not importances:
        return Plot(_name(path), title, caption, skipped="no parameter varied")
    completed = {t.number: t.params for t in study.trials if t.optuna_state == "COMPLETE"}
    grouped = grouped_importances(importances, list(completed.values()))
    together = [n for n in grouped if " + " in n]
    if together:
        caption += (
            f" {' and '.join(together)}: the search always moved these together (in every "
            "completed trial one's value fixed the other's), so their importances cannot be told "
            "apart; one bar carries their sum."
        )
    lone = {n: one_trial_only(n, completed) for n in grouped}
    left = {n: ts for n, ts in lone.items() if ts}
    if left:
        parts = [f"{n} ({grouped[n]:.2f}, {_trials_text(ts)})" for n, ts in left.items()]
        caption += (
            f" Left out, each changed by single trials only: {'; '.join(parts)}: their share "
            "is what those trials changed together, not the parameter's (what speculation "
            "bought: report.md's *What each change bought*)."
        )
    shown = {n: v for n, v in grouped.items() if n not in left}
    if not shown:
        return Plot(_name(path), title, caption,
                    skipped="no parameter had two values each measured twice")  # fmt: skip
    names = list(shown)[::-1]
    values = [shown[n] for n in names]
    ticks = [n.replace(" + ", " +\n") for n in names]  # a group: one member a line
    fig = _figure(7.0, 1.2 + 0.32 * sum(t.count("\n") + 1 for t in ticks))
    ax = fig.add_subplot()
    ax.barh(range(len(names)), values, color="#1f77b4")
    ax.set_yticks(range(len(names)), ticks, fontsize=8)
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:.2f}", va="center", fontsize=7)
    ax.set_xlabel("importance for tok/s (share of all parameters' variation)")
    ax.set_title(f"parameter importances ({study.complete} completed trials)")
    ax.set_xlim(0, max(values) * 1.2 if max(values) > 0 else 1)
    ax.grid(axis="x", alpha=0.3)
    return Plot(_name(path), title, caption, path=_save(fig, path))


def _trials_text(trials: tuple[int, ...]) -> str:
    return ("trial " if len(trials) == 1 else "trials ") + ", ".join(map(str, trials))


# -- best configuration per concurrency -----------------------------------------------------------
def scenario_values(data: StudyData) -> list[tuple[str, int, list[tuple[Row, float]]]]:
    """``(scenario, concurrency, [(row, tok/s)])`` per scenario, by concurrency (measured rows)."""
    report = data.report
    if len(data.concurrency) < 2:
        return []
    prefixed = {sc for r in report.rows for sc, _ in r.per_scenario}
    firsts = [sc for sc in data.concurrency if sc not in prefixed]
    out = []
    for sc, conc in sorted(data.concurrency.items(), key=lambda kv: (kv[1], kv[0])):
        values: list[tuple[Row, float]] = []
        for row in report.rows:
            if not row.ok:
                continue
            if sc in firsts:
                value = row.tok_s_runs
            else:
                value = dict(row.per_scenario).get(sc, math.nan)
            if math.isfinite(value):
                values.append((row, value))
        if values:
            out.append((sc, conc, values))
    return out


BAR_LABEL_COLUMNS = 24  # at 7 pt, narrower than a bar's 1.8 in slot: neighbours never touch
BAR_LABEL_LINES = 3


def bar_label(candidate: Candidate) -> str:
    """A bar's label: :func:`short_label` in at most :data:`BAR_LABEL_LINES` lines of at most
    :data:`BAR_LABEL_COLUMNS` characters."""
    import textwrap

    cols, rows = BAR_LABEL_COLUMNS, BAR_LABEL_LINES
    text = short_label(candidate, cols * rows - rows)  # room for the breaks
    lines = textwrap.wrap(text, cols)
    while len(lines) > rows:  # a long word wrapped short: fewer settings
        text = short_label(candidate, len(text) - 4)
        lines = textwrap.wrap(text, cols)
    return "\n".join(lines)


def plot_concurrency(data: StudyData, path: str) -> Plot:
    title = "Best configuration per concurrency"
    caption = (
        "For each load scenario, the configuration with the highest mean tok/s there (bar, "
        "labelled), the pick's tok/s (red star) and the baseline's (dash)."
    )
    per = scenario_values(data)
    if len(per) < 2:
        return Plot(_name(path), title, caption,
                    skipped="one load scenario: no per-concurrency comparison")  # fmt: skip
    report = data.report
    fig = _figure(1.5 + 1.8 * len(per), 4.6)
    ax = fig.add_subplot()
    for x, (_, _, values) in enumerate(per):
        row, value = max(values, key=lambda rv: rv[1])
        ax.bar(x, value, color="#1f77b4", width=0.6)
        ax.text(x, value, bar_label(row.candidate), ha="center", va="bottom",
                fontsize=7)  # fmt: skip
        for ref, marker, color, label in (
            (report.best, "*", PICK_COLOR, "pick"),
            (report.baseline, "_", BASELINE_COLOR, "baseline"),
        ):
            hit = [v for r, v in values if _same(r, ref)]
            if hit:
                ax.plot([x], hit, marker=marker, ms=16, mew=3, color=color, ls="none",
                        label=label if x == 0 else None)  # fmt: skip
    ax.set_xticks(range(len(per)), [f"{sc}\nconcurrency {c}" for sc, c, _ in per], fontsize=8)
    ax.set_ylabel("output tok/s (all streams of a run)")
    ax.set_ylim(0, ax.get_ylim()[1] * 1.12)  # room for the labels
    ax.set_title("best configuration per load scenario")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return Plot(_name(path), title, caption, path=_save(fig, path))


def plot_pareto(data: StudyData, path: str) -> Plot:
    title = "Throughput against interactivity"
    caption = (
        "Each configuration at each load: output tok/s per GPU against tok/s per user (a "
        "request's decode rate). The Pareto front's points are ringed and joined; a hollow marker "
        "missed study.slo."
    )
    points, _ = pareto_data(data.records, data.concurrency, int(data.attrs.get("tp_size") or 1))
    if not points:
        return Plot(_name(path), title, caption, skipped="no configuration was measured")
    fig = _figure(7.0, 4.8)
    ax = fig.add_subplot()
    scenarios = list(dict.fromkeys(p.scenario for p in points))
    for i, sc in enumerate(scenarios):
        mine = [p for p in points if p.scenario == sc]
        color = f"C{i % 10}"
        for hollow in (False, True):
            sel = [p for p in mine if (not p.feasible) is hollow]
            if sel:
                # Each group is labelled: a load where every point missed the SLO still shows.
                label = f"{sc}, missed study.slo" if hollow else sc
                ax.scatter([p.user_tok_s for p in sel], [p.tok_s_per_gpu for p in sel], s=28,
                           facecolors="none" if hollow else color, edgecolors=color,
                           label=label)  # fmt: skip
    front = sorted((p for p in points if p.on_front), key=lambda p: p.user_tok_s)
    ax.plot([p.user_tok_s for p in front], [p.tok_s_per_gpu for p in front], color=PICK_COLOR,
            lw=1.2, marker="o", ms=11, mfc="none", label="Pareto front")  # fmt: skip
    ax.set_xlabel("tok/s per user (decode rate of one request)")
    ax.set_ylabel("output tok/s per GPU")
    ax.grid(alpha=0.3)
    # Beside the axes: one entry per load (and per load that missed the SLO) covered points.
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return Plot(_name(path), title, caption, path=_save(fig, path))


PLOTS: tuple[tuple[str, Callable[[StudyData, str], Plot]], ...] = (
    ("history.png", plot_history),
    ("runs.png", plot_runs),
    ("steps_topk.png", plot_steps_topk),
    ("accept_length.png", plot_accept_length),
    ("importances.png", plot_importances),
    ("concurrency.png", plot_concurrency),
    ("pareto.png", plot_pareto),
)
"""The report's plots, in the report's order: (file name, drawing function)."""


def draw_plots(data: StudyData, folder: str) -> list[Plot]:
    """Draw every plot into ``folder``; a plot that fails is reported as skipped, with why."""
    out = []
    for name, draw in PLOTS:
        try:
            out.append(draw(data, os.path.join(folder, name)))
        except Exception as exc:  # noqa: BLE001 - one broken plot must not lose the report
            out.append(Plot(name, name, skipped=f"drawing failed: {type(exc).__name__}: {exc}"))
    return out
