"""The report's per-category table: the pick against the baseline, prompt category by category.

Read from the trial rows' ``category__<cat>__<metric>`` columns (stored when ``bench.prompts``
has more than one category); a configuration's starts are pooled, each trial weighted by its
requests of that category. A study without such columns (one category, or written before
them) has no table.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Any

from rayspec._types import category_key

if TYPE_CHECKING:
    from rayspec.report._load import StudyData

__all__ = ["category_lines", "category_rows"]

_REQUESTS = re.compile(r"^category__(.+)__requests$")
_NAN = float("nan")


def _categories(rows: Sequence[dict[str, Any]]) -> list[str]:
    found = {
        m.group(1)
        for row in rows
        for key, value in row.items()
        if value is not None and (m := _REQUESTS.match(key))
    }
    return sorted(found)


def _pooled(rows: list[dict[str, Any]], cat: str) -> tuple[float, float, float]:
    """Requests, tok/s and accept length of ``cat`` over ``rows`` (request-weighted)."""
    total = 0.0
    sums = {"tok_s": [0.0, 0.0], "accept_length": [0.0, 0.0]}  # weighted sum, weight
    for row in rows:
        n = row.get(category_key(cat, "requests"))
        if not isinstance(n, int | float) or n <= 0:
            continue
        total += n
        for metric, pair in sums.items():
            value = row.get(category_key(cat, metric))
            if isinstance(value, int | float) and math.isfinite(value):
                pair[0] += n * value
                pair[1] += n
    tok, accept = (v[0] / v[1] if v[1] else _NAN for v in sums.values())
    return total, tok, accept


def category_rows(data: StudyData) -> list[dict[str, Any]]:
    """One entry per category: the pick's and the baseline's requests, tok/s, accept length
    and the tok/s ratio (empty without per-category columns or without a pick)."""
    best, base = data.report.best, data.report.baseline
    cats = _categories(data.rows)
    if best is None or len(cats) < 2:
        return []
    by_trial = {int(r["trial"]): r for r in data.rows}

    def rows_of(trials: Sequence[int]) -> list[dict[str, Any]]:
        return [by_trial[t] for t in trials if t in by_trial]

    out = []
    for cat in cats:
        n, tok, acc = _pooled(rows_of(best.trials), cat)
        bn, btok, bacc = _pooled(rows_of(base.trials if base is not None else ()), cat)
        out.append({
            "category": cat, "requests": n, "tok_s": tok, "accept_length": acc,
            "baseline_requests": bn, "baseline_tok_s": btok, "baseline_accept_length": bacc,
            "ratio": tok / btok if btok > 0 else _NAN,
        })  # fmt: skip
    return out


def _num(value: float, fmt: str) -> str:
    return format(value, fmt) if math.isfinite(value) else "—"


def category_lines(data: StudyData) -> list[str]:
    """The report's section (no lines when there is no table)."""
    entries = category_rows(data)
    if not entries:
        return []
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
    for e in entries:
        ratio = f"{e['ratio']:.2f}x" if math.isfinite(e["ratio"]) else "—"
        lines.append(
            f"| {e['category'].replace('|', '/')} | {e['requests']:.0f} / "
            f"{e['baseline_requests']:.0f} | {_num(e['tok_s'], '.1f')} | "
            f"{_num(e['baseline_tok_s'], '.1f')} | {ratio} | "
            f"{_num(e['accept_length'], '.2f')} | {_num(e['baseline_accept_length'], '.2f')} |"
        )
    return lines
