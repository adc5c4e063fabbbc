"""The report's per-category table: the pick against the baseline, prompt category by category.

Read from the study's per-category rows (``categories/``, one row per trial and category the
trial's objective scenario reached: :meth:`rayspec.store.ParquetTrialStore.category_rows`);
a configuration's starts are pooled, each trial weighted by its requests of that category. A
study without such rows (one category) has no table.

A prompt set may hold tens of thousands of categories: the table shows the
:data:`SHOWN_CATEGORIES` with the most requests of the pick, and one line sums up the rest. A
category's name is the data's text: it is written escaped (one line, no table cell break, no
HTML) and cut at :data:`NAME_CHARS` characters.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

from rayspec._plural import plural
from rayspec.report._escape import md_cell

if TYPE_CHECKING:
    from rayspec.report._load import StudyData

__all__ = ["NAME_CHARS", "SHOWN_CATEGORIES", "category_lines", "category_rows"]

SHOWN_CATEGORIES = 20
"""The categories the report's table shows (the pick's most requested first)."""

NAME_CHARS = 80
"""A category's name is cut to this many characters in the table."""

_NAN = float("nan")


def _pooled(rows: Iterable[dict[str, Any]]) -> dict[str, tuple[float, float, float]]:
    """category -> (requests, tok/s, accept length) over ``rows`` (request-weighted)."""
    sums: dict[str, list[float]] = {}  # requests, tok*n, n(tok), acc*n, n(acc)
    for row in rows:
        n = row.get("requests")
        if not isinstance(n, int | float) or not math.isfinite(n) or n <= 0:
            continue
        acc = sums.setdefault(str(row["category"]), [0.0, 0.0, 0.0, 0.0, 0.0])
        acc[0] += n
        for i, metric in ((1, "tok_s"), (3, "accept_length")):
            value = row.get(metric)
            if isinstance(value, int | float) and math.isfinite(value):
                acc[i] += n * value
                acc[i + 1] += n
    return {
        cat: (a[0], a[1] / a[2] if a[2] else _NAN, a[3] / a[4] if a[4] else _NAN)
        for cat, a in sums.items()
    }


def category_rows(data: StudyData) -> list[dict[str, Any]]:
    """One entry per category: the pick's and the baseline's requests, tok/s, accept length
    and the tok/s ratio, the pick's most requested first (empty for fewer than two categories
    or without a pick)."""
    best, base = data.report.best, data.report.baseline
    if best is None:
        return []

    def of(trials: Sequence[int]) -> dict[str, tuple[float, float, float]]:
        wanted = set(trials)
        return _pooled(r for r in data.categories if int(r["trial"]) in wanted)

    pick = of(best.trials)
    baseline = of(base.trials if base is not None else ())
    cats = set(pick) | set(baseline)
    if len(cats) < 2:
        return []
    empty = (0.0, _NAN, _NAN)
    out: list[dict[str, Any]] = []
    for cat in cats:
        n, tok, acc = pick.get(cat, empty)
        bn, btok, bacc = baseline.get(cat, empty)
        out.append({
            "category": cat, "requests": n, "tok_s": tok, "accept_length": acc,
            "baseline_requests": bn, "baseline_tok_s": btok, "baseline_accept_length": bacc,
            "ratio": tok / btok if btok > 0 else _NAN,
        })  # fmt: skip
    out.sort(key=lambda e: (-e["requests"], -e["baseline_requests"], e["category"]))
    return out


def _num(value: float, fmt: str) -> str:
    return format(value, fmt) if math.isfinite(value) else "—"


def category_lines(data: StudyData) -> list[str]:
    """The report's section (no lines when there is no table)."""
    entries = category_rows(data)
    if not entries:
        return []
    shown, rest = entries[:SHOWN_CATEGORIES], entries[SHOWN_CATEGORIES:]
    lines = [
        "",
        "## By prompt category",
        "",
        "The objective scenario's requests by their prompt's category, the pick's starts pooled "
        "and the baseline's: tok/s is a category's tokens over its requests' summed times (one "
        "stream's speed under load), accept len its requests' mean tokens per verify step.",
        "",
        "| category | requests (pick / baseline) | pick tok/s | baseline tok/s | pick / baseline "
        "| pick accept len | baseline accept len |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in shown:
        ratio = f"{e['ratio']:.2f}x" if math.isfinite(e["ratio"]) else "—"
        lines.append(
            f"| {md_cell(e['category'], NAME_CHARS)} | {e['requests']:.0f} / "
            f"{e['baseline_requests']:.0f} | {_num(e['tok_s'], '.1f')} | "
            f"{_num(e['baseline_tok_s'], '.1f')} | {ratio} | "
            f"{_num(e['accept_length'], '.2f')} | {_num(e['baseline_accept_length'], '.2f')} |"
        )
    if rest:
        n = sum(e["requests"] for e in rest)
        bn = sum(e["baseline_requests"] for e in rest)
        lines += [
            "",
            f"… and {plural(len(rest), 'more category', 'more categories')} ({n:.0f} of the "
            f"pick's requests, {bn:.0f} of the baseline's), not shown: every trial's figures "
            "per category are in `categories/` (Parquet, one row per trial and category).",
        ]
    return lines
