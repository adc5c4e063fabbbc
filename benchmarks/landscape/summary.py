"""The readable summary of the recorded landscapes (``benchmarks/results/landscape_cpu.txt``).

Per drafter and setting: tok/s as the mean of its starts' means with the 95 % interval over
starts (Student t), the start-to-start sd (of the start means) and the run-to-run sd within a
start (pooled), accept length, startup seconds; then the best setting, its gain over no
speculation (the ratio of the means, with a delta-method 95 % interval), whether its greedy
output was the same as no speculation's, and the machine's load while it ran.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.landscape.store import read_landscape
from rayspec.bench import mean_ci95
from rayspec.bench import t_ppf

OFF = "off"


@dataclasses.dataclass(frozen=True)
class SettingStats:
    setting: str
    mode: str
    num_steps: int | None
    eagle_topk: int | None
    num_draft_tokens: int | None
    starts: int
    runs: int
    mean: float  # of the start means
    low: float
    high: float
    start_sd: float  # sd of the start means
    run_sd: float  # pooled sd of the runs within a start
    accept_length: float | None
    startup_s: float
    load: float  # mean load at its starts

    @property
    def short(self) -> str:
        if self.mode == OFF:
            return "no speculation"
        steps = "1 step" if self.num_steps == 1 else f"{self.num_steps} steps"
        return f"{steps}, topk {self.eagle_topk}, {self.num_draft_tokens} tokens"


def setting_stats(rows: Iterable[Mapping[str, Any]]) -> list[SettingStats]:
    """One entry per setting of a landscape's rows (measured runs only), fastest first."""
    by_setting: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["run"] >= 0:
            by_setting[row["setting"]].append(row)
    out = []
    for setting, rs in by_setting.items():
        starts: dict[int, list[Mapping[str, Any]]] = defaultdict(list)
        for r in rs:
            starts[int(r["start"])].append(r)
        means = [statistics.fmean(r["tok_s"] for r in s) for s in starts.values()]
        mean, low, high = mean_ci95(means)
        within = [
            (len(s) - 1, statistics.variance([r["tok_s"] for r in s]))
            for s in starts.values()
            if len(s) > 1
        ]
        dof = sum(d for d, _ in within)
        run_sd = math.sqrt(sum(d * v for d, v in within) / dof) if dof else math.nan
        acc = [r["accept_length"] for r in rs if r["accept_length"] is not None]
        first = rs[0]
        out.append(
            SettingStats(
                setting=setting,
                mode=first["mode"],
                num_steps=first["num_steps"],
                eagle_topk=first["eagle_topk"],
                num_draft_tokens=first["num_draft_tokens"],
                starts=len(starts),
                runs=len(rs),
                mean=mean,
                low=low,
                high=high,
                start_sd=statistics.stdev(means) if len(means) > 1 else math.nan,
                run_sd=run_sd,
                accept_length=statistics.fmean(acc) if acc else None,
                startup_s=statistics.fmean(s[0]["startup_s"] for s in starts.values()),
                load=statistics.fmean(s[0]["load_1m"] for s in starts.values()),
            )
        )
    return sorted(out, key=lambda s: -s.mean)


def gain(best: SettingStats, off: SettingStats) -> tuple[float, float, float]:
    """best / off - 1 with a delta-method 95 % interval from the start means' errors."""
    ratio = best.mean / off.mean
    se2 = 0.0
    dof = []
    for s in (best, off):
        if s.starts > 1 and math.isfinite(s.start_sd):
            se2 += (s.start_sd / s.mean) ** 2 / s.starts
            dof.append(s.starts - 1)
    if not dof:
        return ratio - 1, math.nan, math.nan
    half = t_ppf(0.975, min(dof)) * ratio * math.sqrt(se2)
    return ratio - 1, ratio - half - 1, ratio + half - 1


def greedy_agreement(rows: Iterable[Mapping[str, Any]], setting: str) -> tuple[int, int]:
    """Runs of ``setting`` whose greedy output equals no speculation's for the same prompt
    (the same run index), and how many were compared."""
    reference: dict[int, list[int]] = {}
    mine = []
    for r in rows:
        if r["run"] < 0:
            continue
        if r["mode"] == OFF:
            reference.setdefault(int(r["run"]), list(r["output_ids"]))
        if r["setting"] == setting:
            mine.append(r)
    compared = [r for r in mine if int(r["run"]) in reference]
    same = sum(1 for r in compared if list(r["output_ids"]) == reference[int(r["run"])])
    return same, len(compared)


def _fmt(x: float | None, digits: int = 2) -> str:
    return "—" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def _interval(low: float, high: float) -> str:
    return f"{low:.2f}-{high:.2f}" if math.isfinite(low) and math.isfinite(high) else "—"


def landscape_text(name: str, rows: list[dict[str, Any]], meta: Mapping[str, Any]) -> str:
    stats = setting_stats(rows)
    lines = [f"## {name} (drafter noise {meta.get('drafter_noise', '?')})", ""]
    if not stats:
        return "\n".join([*lines, "(no starts recorded yet)", ""])
    lines.append(
        f"{'setting':<34} {'tok/s':>7} {'95 % over starts':>17} {'start sd':>8} "
        f"{'run sd':>7} {'accept':>6} {'starts':>6} {'startup s':>9}"
    )
    for s in stats:
        lines.append(
            f"{s.short:<34} {_fmt(s.mean):>7} {_interval(s.low, s.high):>17} "
            f"{_fmt(s.start_sd):>8} {_fmt(s.run_sd):>7} {_fmt(s.accept_length):>6} "
            f"{s.starts:>6} {_fmt(s.startup_s, 0):>9}"
        )
    off = next((s for s in stats if s.mode == OFF), None)
    spec = [s for s in stats if s.mode != OFF]
    lines.append("")
    if spec:
        best = spec[0]
        same, compared = greedy_agreement(rows, best.setting)
        lines.append(f"best EAGLE-3 setting: {best.short}, {_fmt(best.mean)} tok/s")
        if off is not None:
            g, lo, hi = gain(best, off)
            ci = f" (95 % {100 * lo:+.1f} to {100 * hi:+.1f} %)" if math.isfinite(lo) else ""
            lines.append(
                f"gain over no speculation ({_fmt(off.mean)} tok/s): {100 * g:+.1f} %{ci}"
            )
        lines.append(f"its greedy output equal to no speculation's: {same} of {compared} runs")
    all_same = sum(greedy_agreement(rows, s.setting)[0] for s in spec)
    all_n = sum(greedy_agreement(rows, s.setting)[1] for s in spec)
    loads = [r["load_1m"] for r in rows if r["run"] == -1]
    starts = len({(r["setting"], r["start"]) for r in rows})
    lines.append(
        f"greedy output equal to no speculation's, all EAGLE-3 runs: {all_same} of {all_n}"
    )
    if loads:
        lines.append(
            f"machine load (1-min average at each of {starts} starts): median "
            f"{statistics.median(loads):.1f}, range {min(loads):.1f}-{max(loads):.1f} "
            f"({meta.get('machine', {}).get('cores', '?')} cores)"
        )
    lines.append("")
    return "\n".join(lines)


def write_summary(folder: Path, out: Path) -> str:
    """Summarise every ``cpu-*.parquet`` of ``folder`` into ``out``; returns the text."""
    parts = [
        "# The CPU landscapes: real SGLang 0.5.23 on a 2-core CPU "
        "(benchmarks/record_landscape.py)",
        "",
        "tok/s: the mean of the starts' means (each start: 8 runs of one 96-token request after",
        "one warm-up); 95 % interval over starts (Student t); start sd: sd of the start means;",
        "run sd: pooled sd of runs within a start. No speculation's starts are the same in every",
        "drafter's file. A shared machine: the load column says how shared.",
        "",
    ]
    meta: Mapping[str, Any] = {}
    for path in sorted(folder.glob("cpu-*.parquet")):
        rows, meta = read_landscape(path)
        parts.append(landscape_text(path.stem, rows, meta))
    if meta:
        parts.append(f"re-record: {meta.get('command', '?')}")
        parts.append(f"machine: {meta.get('machine')}; models {meta.get('model_recipe')}")
        parts.append("")
    text = "\n".join(parts)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return text
