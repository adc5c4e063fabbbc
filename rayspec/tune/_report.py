"""The end of a study: the best configuration as files and a table in the field table's form.

Reads only the Parquet store, so a report can be rebuilt from a study folder at any time.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
from dataclasses import dataclass
from typing import Any

import yaml

from rayspec._config import Engine
from rayspec._config import ExperimentConfig
from rayspec._types import Candidate
from rayspec._types import SpecSettings
from rayspec.server import build_launch
from rayspec.tune._decide import Measured
from rayspec.tune._decide import pick

__all__ = ["Row", "StudyReport", "build_report", "deploy_script", "format_table", "write_best"]


@dataclass(frozen=True)
class Row:
    """One trial as the report shows it."""

    trial: int
    state: str
    label: str
    tok_s_mean: float
    tok_s_peak: float
    accept_length: float
    role: str  # baseline, enqueued[i], or ""
    candidate: Candidate
    failure: str = ""
    runs: tuple[float, ...] = ()
    vs_baseline_significant: float = math.nan
    vs_baseline_ci: tuple[float, float] = (math.nan, math.nan)
    per_scenario: tuple[tuple[str, float], ...] = ()

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETE" and math.isfinite(self.tok_s_mean)


@dataclass(frozen=True)
class StudyReport:
    rows: tuple[Row, ...]  # COMPLETE rows, fastest first
    baseline: Row | None
    best: Row | None  # the pick: the fastest, or a cheaper one within noise of it
    failed: int
    pruned: int
    total: int
    fastest: Row | None = None
    pick_note: str = ""  # why best is not the fastest, when it is not
    best_per_scenario: tuple[tuple[str, Row], ...] = ()
    bench_s_saved: float = 0.0
    reused: int = 0  # trials that repeated a measured configuration (not launched again)


def _f(value: Any) -> float:
    return float(value) if value is not None else math.nan


def candidate_from_row(r: dict[str, Any]) -> Candidate:
    """The candidate a stored trial row describes."""
    spec = None
    if r.get("spec_algorithm"):
        spec = SpecSettings(
            r["spec_algorithm"],
            int(r["spec_num_steps"]),
            int(r["spec_eagle_topk"]),
            int(r["spec_num_draft_tokens"]),
        )
    params = json.loads(r["params"]) if r.get("params") else {}
    nccl = tuple(
        sorted(
            (k.removeprefix("nccl."), str(v))
            for k, v in params.items()
            if k.startswith("nccl.") and v != "unset"
        )
    )
    flags = []
    for k, v in params.items():
        if k.startswith("flags.") and v != "off":
            flags += [k.removeprefix("flags.")] + ([] if v == "on" else [str(v)])
    return Candidate(nccl_env=nccl, spec=spec, flags=tuple(flags))


def _runs(r: dict[str, Any]) -> tuple[float, ...]:
    return tuple(float(v) for v in json.loads(r["run_values"])) if r.get("run_values") else ()


def build_report(
    trial_rows: list[dict[str, Any]],
    roles: dict[int, str],
    *,
    alpha: float = 0.05,
    margin: float = 0.02,
) -> StudyReport:
    """Rank the stored trials and pick the configuration to deploy.

    Args:
        trial_rows: the Parquet trial rows (``ParquetTrialStore.load_trials().to_pylist()``).
        roles: trial number -> "baseline" / "enqueued[i]" for the configurations tried first.
        alpha: significance level for "within noise".
    """
    scenarios = sorted({k.split("__", 1)[0] for r in trial_rows for k in r if "__tok_s_mean" in k})
    rows = [
        Row(
            trial=int(r["trial"]),
            state=str(r["state"]),
            label=str(r["candidate"]),
            tok_s_mean=_f(r.get("tok_s_mean")),
            tok_s_peak=_f(r.get("tok_s_peak")),
            accept_length=_f(r.get("accept_length")),
            role=roles.get(int(r["trial"]), ""),
            candidate=candidate_from_row(r),
            failure=str(r.get("failure") or ""),
            runs=_runs(r),
            vs_baseline_significant=_f(r.get("vs_baseline_significant")),
            vs_baseline_ci=(_f(r.get("vs_baseline_ci95_low")), _f(r.get("vs_baseline_ci95_high"))),
            per_scenario=tuple((sc, _f(r.get(f"{sc}__tok_s_mean"))) for sc in scenarios),
        )
        for r in trial_rows
        if not r.get("note")  # a reused measurement is the same point again
    ]
    ok = sorted((r for r in rows if r.ok), key=lambda r: (-r.tok_s_mean, r.trial))
    baseline = next((r for r in ok if r.role == "baseline"), None)
    by_trial = {r.trial: r for r in ok}
    choice = pick(
        [Measured(r.trial, r.candidate, r.runs) for r in ok if r.runs], alpha=alpha, margin=margin
    )
    best = fastest = ok[0] if ok else None
    note = ""
    if choice is not None:
        best, fastest = by_trial[choice.chosen.trial], by_trial[choice.fastest.trial]
        if choice.comparison is not None:
            c = choice.comparison
            note = (
                f"trial {best.trial} is within noise of the fastest, trial {fastest.trial} "
                f"(ratio {c.ratio:.3f}, 95 % CI [{c.ci95_low:.3f}, {c.ci95_high:.3f}], "
                f"p = {c.p_value:.2f}) and cheaper (fewer draft tokens / steps): picked"
            )
    per_scenario = []
    for i, sc in enumerate(scenarios):
        ranked = [r for r in ok if math.isfinite(r.per_scenario[i][1])]
        if ranked:
            per_scenario.append((sc, max(ranked, key=lambda r: r.per_scenario[i][1])))
    saved = sum(_f(r.get("bench_s_saved")) for r in trial_rows if r["state"] == "PRUNED")
    reused = sum(1 for r in trial_rows if r.get("note"))
    return StudyReport(
        rows=tuple(ok),
        baseline=baseline,
        best=best,
        failed=sum(r.state == "FAIL" for r in rows),
        pruned=sum(r.state == "PRUNED" for r in rows),
        total=len(rows) + reused,
        reused=reused,
        fastest=fastest,
        pick_note=note,
        best_per_scenario=tuple(per_scenario),
        bench_s_saved=0.0 if math.isnan(saved) else saved,
    )


def _vs(row: Row, baseline: Row | None) -> str:
    if baseline is None or row.trial == baseline.trial:
        return "—"
    text = f"{(row.tok_s_mean / baseline.tok_s_mean - 1) * 100:+.1f} %"
    if row.vs_baseline_significant == 0.0:
        text += " (within noise)"
    return text


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
    """The field table's form: config, tok/s mean, peak, vs baseline; best first."""
    shown = list(report.rows[:limit])
    for extra in (r for r in report.rows if r.role and r not in shown):
        shown.append(extra)
    lines = [
        "| # | config | tok/s avg | tok/s peak | accept len | vs baseline |",
        "|---|---|---|---|---|---|",
    ]
    for r in shown:
        tag = f" ({r.role})" if r.role else ""
        if report.best is not None and r.trial == report.best.trial:
            tag += " (picked)"
        acc = f"{r.accept_length:.2f}" if math.isfinite(r.accept_length) else "—"
        lines.append(
            f"| {r.trial} | {r.label}{tag} | {r.tok_s_mean:.1f} | {r.tok_s_peak:.1f} | {acc} | "
            f"{_vs(r, report.baseline)} |"
        )
    return "\n".join(lines)


MODEL_PLACEHOLDER = "${MODEL_PATH}"
DRAFT_PLACEHOLDER = "${DRAFT_MODEL_PATH}"


def _deploy_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """The experiment as a real SGLang launch (a twin study deploys to SGLang too)."""
    real = cfg.server.engine is Engine.sglang
    server = dataclasses.replace(
        cfg.server,
        engine=Engine.sglang,
        python="python",
        model_path=cfg.server.model_path if real else MODEL_PLACEHOLDER,
        draft_model_path=cfg.server.draft_model_path if real else DRAFT_PLACEHOLDER,
    )
    return dataclasses.replace(cfg, server=server)


def deploy_script(cfg: ExperimentConfig, row: Row, baseline: Row | None) -> str:
    """A bash script with the exact environment and ``python -m sglang.launch_server`` line."""
    dcfg = _deploy_config(cfg)
    launch = build_launch(dcfg, row.candidate, port=cfg.server.port, log_path="-")
    placeholders = {
        MODEL_PLACEHOLDER: '"${MODEL_PATH:?set MODEL_PATH to the target model}"',
        DRAFT_PLACEHOLDER: '"${DRAFT_MODEL_PATH:?set DRAFT_MODEL_PATH to the EAGLE-3 drafter}"',
    }
    quoted = [placeholders.get(arg) or shlex.quote(arg) for arg in launch.argv]
    vs = _vs(row, baseline)
    lines = [
        "#!/usr/bin/env bash",
        f"# rayspec study {cfg.study.name}, trial {row.trial}: {row.label}",
        f"# {row.tok_s_mean:.1f} tok/s mean, {row.tok_s_peak:.1f} peak, {vs} vs baseline"
        + (f" ({baseline.tok_s_mean:.1f} tok/s)" if baseline else ""),
    ]
    if cfg.server.engine is Engine.twin:
        lines.append(
            f"# MEASURED ON THE DIGITAL TWIN (profile {cfg.server.twin.profile}), not on GPUs: "
            "re-measure on a real node before deploying."
        )
    lines += ["set -euo pipefail"]
    if launch.unset_env:
        lines.append("unset " + " ".join(launch.unset_env))
    lines += [f"export {k}={shlex.quote(v)}" for k, v in launch.env]
    lines.append("exec " + " ".join(quoted) + ' "$@"')
    return "\n".join(lines) + "\n"


def write_best(cfg: ExperimentConfig, report: StudyReport) -> tuple[str, str] | None:
    """Write ``<out>/best.yaml`` and ``<out>/best.sh``; None when no trial completed."""
    best = report.best
    if best is None:
        return None
    dcfg = _deploy_config(cfg)
    launch = build_launch(dcfg, best.candidate, port=cfg.server.port, log_path="-")
    base = report.baseline
    doc: dict[str, Any] = {
        "study": cfg.study.name,
        "engine": cfg.server.engine.value,
        "measured_on": (
            f"digital twin, profile {cfg.server.twin.profile} (simulated)"
            if cfg.server.engine is Engine.twin
            else "sglang"
        ),
        "trial": best.trial,
        "config": best.label,
        "tok_s_mean": round(best.tok_s_mean, 3),
        "tok_s_peak": round(best.tok_s_peak, 3),
        "accept_length": None if math.isnan(best.accept_length) else round(best.accept_length, 4),
        "baseline": None
        if base is None
        else {"trial": base.trial, "config": base.label, "tok_s_mean": round(base.tok_s_mean, 3)},
        "vs_baseline": None if base is None else round(best.tok_s_mean / base.tok_s_mean - 1, 4),
        "speculative": None if best.candidate.spec is None else {
            "algorithm": best.candidate.spec.algorithm,
            "num_steps": best.candidate.spec.num_steps,
            "eagle_topk": best.candidate.spec.eagle_topk,
            "num_draft_tokens": best.candidate.spec.num_draft_tokens,
        },
        "env": dict(launch.env),
        "unset_env": list(launch.unset_env),
        "argv": list(launch.argv),
    }  # fmt: skip
    out = cfg.out_dir
    os.makedirs(out, exist_ok=True)
    yaml_path = os.path.join(out, "best.yaml")
    sh_path = os.path.join(out, "best.sh")
    _write_text(yaml_path, yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    _write_text(sh_path, deploy_script(cfg, best, base))
    os.chmod(sh_path, 0o755)
    return yaml_path, sh_path


def _write_text(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)
