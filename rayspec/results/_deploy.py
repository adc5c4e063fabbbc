"""The files a study hands the user: ``best.yaml`` (the pick as data), ``best.sh`` (what the
report recommends, as the real SGLang launch) and, for a twin study, ``best-twin.sh`` (the
static pick on the twin).

With a per-load plan (SGLang's adaptive tiers, ``adaptive_tiers.json`` beside the scripts)
``best.sh`` is the plan where its verification recommends it, and ``best-static.sh`` the static
pick; otherwise ``best.sh`` is the static pick and ``best-adaptive.sh`` the plan: one file per
option the report offers, the recommended one always ``best.sh``.

Comment lines are written through :func:`rayspec._text.one_line` and every argument through
:func:`rayspec._text.shell_quote` (the engine's :func:`rayspec.engines.deploy_lines`): nothing a
value carries becomes a line of a script.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import yaml

from rayspec._config import Engine
from rayspec._config import ExperimentConfig
from rayspec._plural import plural
from rayspec._secrets import redact_env
from rayspec._secrets import secret_lines
from rayspec._secrets import split_secrets
from rayspec._text import one_line
from rayspec._types import LaunchSpec
from rayspec.engines import deploy_lines
from rayspec.engines import engine_named
from rayspec.results._plan import Plan
from rayspec.results._plan import PlanVerdict
from rayspec.results._saved import write_text
from rayspec.results._sure import above_peak
from rayspec.results._sure import gains
from rayspec.results._sure import interval
from rayspec.results._sure import tie_note
from rayspec.results._table import Row
from rayspec.results._table import StudyReport
from rayspec.results._table import vs_baseline
from rayspec.server import ADAPTIVE_CONFIG_FLAG
from rayspec.server import build_launch
from rayspec.server import tiers_json
from rayspec.store import StudyFolder
from rayspec.twin import available_profiles

__all__ = [
    "DRAFT_PLACEHOLDER",
    "MODEL_PLACEHOLDER",
    "deploy_config",
    "deploy_script",
    "plan_recommended",
    "plan_script",
    "twin_script",
    "write_best",
]

MODEL_PLACEHOLDER = "${MODEL_PATH}"
DRAFT_PLACEHOLDER = "${DRAFT_MODEL_PATH}"
TIERS_PLACEHOLDER = "${ADAPTIVE_TIERS}"
# The plan's tiers file beside the script, wherever the study folder is moved (a constant).
TIERS_BESIDE = '"$(dirname -- "${BASH_SOURCE[0]}")/adaptive_tiers.json"'
_PATHS = {
    MODEL_PLACEHOLDER: '"${MODEL_PATH:?set MODEL_PATH to the target model}"',
    DRAFT_PLACEHOLDER: '"${DRAFT_MODEL_PATH:?set DRAFT_MODEL_PATH to the EAGLE-3 drafter}"',
}


def deploy_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """The experiment as a real SGLang launch (a twin study deploys to SGLang too), with the
    interpreter the study measured (``server.python``), else ``python`` from the PATH."""
    real = cfg.server.engine is Engine.sglang
    server = dataclasses.replace(
        cfg.server,
        engine=Engine(engine_named(cfg.server.engine.value).deploys_as),
        python=(cfg.server.python if real else "") or "python",
        model_path=cfg.server.model_path if real else MODEL_PLACEHOLDER,
        draft_model_path=cfg.server.draft_model_path if real else DRAFT_PLACEHOLDER,
    )
    return dataclasses.replace(cfg, server=server)


def deploy_script(
    cfg: ExperimentConfig,
    row: Row,
    baseline: Row | None,
    *,
    tied: str = "",
    script: str = "best.sh",
    also: str = "",
) -> str:
    """A bash script with the exact environment and ``python -m sglang.launch_server`` line.

    Args:
        tied: :func:`~rayspec.results.tie_note` of the study (the pick tied within noise, and
            the rule that chose): a comment line of its own.
        script: the file's name, for the lines that name it.
        also: a comment line naming the other option's file (a per-load plan).
    """
    dcfg = deploy_config(cfg)
    launch = build_launch(dcfg, row.candidate, port=cfg.server.port, log_path="-")
    vs = vs_baseline(row, baseline, noise=True)
    # Comment lines are written through one_line: a line break in a value would end the
    # comment and make the rest a command of the script.
    comments = [
        f"rayspec study {cfg.study.name}, trial {row.trial}: {row.label}",
        f"{row.tok_s_mean:.1f} tok/s ({plural(row.starts, 'server start')} x "
        f"{plural(row.runs // max(1, row.starts), 'run')} pooled), {row.tok_s_peak:.1f} peak, "
        f"{vs} vs baseline" + (f" ({baseline.tok_s_mean:.1f} tok/s)" if baseline else ""),
    ]
    if above_peak(row):
        comments.append(
            "the estimate is above this configuration's peak: it pools its neighbours through "
            "the fitted surface; the peak is what was measured"
        )
    if tied:
        comments.append(tied)
    if also:
        comments.append(also)
    comments += _twin_comments(cfg, twin=True)
    lines = ["#!/usr/bin/env bash", *(f"# {one_line(text)}" for text in comments)]
    lines += ["set -euo pipefail", *_launch_lines(launch, script, _PATHS)]
    return "\n".join(lines) + "\n"


def _twin_comments(cfg: ExperimentConfig, *, twin: bool) -> list[str]:
    if cfg.server.engine is not Engine.twin:
        return []
    out = [
        f"MEASURED ON THE DIGITAL TWIN (profile {cfg.server.twin.profile}), not on GPUs: "
        "re-measure on a real node before deploying."
    ]
    if twin:
        twin_sh = os.path.basename(StudyFolder(cfg.out_dir).best_twin_sh)
        out.append(f"Without GPUs: {twin_sh} beside this file serves it on the twin.")
    return out


def plan_recommended(verdict: PlanVerdict | None) -> bool:
    """Whether ``best.sh`` launches the per-load plan: its verification recommends it."""
    return verdict is not None and verdict.recommended


def plan_script(
    cfg: ExperimentConfig,
    plan: Plan,
    verdict: PlanVerdict | None,
    *,
    script: str = "best-adaptive.sh",
    also: str = "",
) -> str:
    """The per-load plan as a bash script, written as :func:`deploy_script` writes the pick:
    SGLang's adaptive steps with the plan's NCCL set, ``--speculative-adaptive-config`` the
    ``adaptive_tiers.json`` beside the script (the path is a constant, never a value).

    Args:
        verdict: the plan's verification (None: not verified; the comment says so).
        script: the file's name, for the lines that name it.
        also: a comment line naming the other option's file.
    """
    launch = build_launch(deploy_config(cfg), plan.candidate(), port=cfg.server.port, log_path="-")
    launch = dataclasses.replace(
        launch, argv=(*launch.argv, ADAPTIVE_CONFIG_FLAG, TIERS_PLACEHOLDER), files=()
    )
    tiers = ", ".join(
        f"{bs} -> {plural(steps[0], 'step')}" if steps[0] else f"{bs} -> no speculation"
        for bs, steps in plan.tiers
    )
    comments = [
        f"rayspec study {cfg.study.name}: the per-load plan (SGLang's adaptive tiers, one server "
        f"for every load): {plan.candidate().label()}",
        f"tiers by concurrency: {tiers} (adaptive_tiers.json beside this file)",
    ]
    if verdict is None:
        comments.append(
            "not verified: no trial ran this plan (study.verify_plan); the report compares it "
            "with the static pick once one has"
        )
    else:
        trials = ", ".join(map(str, verdict.trials))
        comments.append(f"verified by trial {trials} at every load: {verdict.why}")
    if also:
        comments.append(also)
    comments += _twin_comments(cfg, twin=False)
    lines = ["#!/usr/bin/env bash", *(f"# {one_line(text)}" for text in comments)]
    placeholders = {**_PATHS, TIERS_PLACEHOLDER: TIERS_BESIDE}
    lines += ["set -euo pipefail", *_launch_lines(launch, script, placeholders)]
    return "\n".join(lines) + "\n"


def _launch_lines(
    launch: LaunchSpec, script: str, placeholders: dict[str, str] | None = None
) -> list[str]:
    """The launch's lines, each secret taken from the environment the script runs in (never
    written: :mod:`rayspec._secrets`)."""
    plain, secrets = split_secrets(launch.env)
    launch = dataclasses.replace(launch, env=plain)
    return [*secret_lines(secrets, script), *deploy_lines(launch, placeholders)]


def _absolute_profile(cfg: ExperimentConfig) -> ExperimentConfig:
    """``server.twin.profile`` as an absolute path when it is a file, not a built-in name: the
    script runs from any folder."""
    profile = cfg.server.twin.profile
    if not profile or profile in available_profiles():
        return cfg
    twin = dataclasses.replace(cfg.server.twin, profile=os.path.abspath(profile))
    return dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, twin=twin))


def twin_script(cfg: ExperimentConfig, row: Row) -> str:
    """A twin study's pick on the twin, where the study ran: ``python -m rayspec.twin.server``
    with best.sh's flags and environment, the study's interpreter, no injected fault."""
    twin = dataclasses.replace(cfg.server.twin, fault="")
    tcfg = _absolute_profile(
        dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, twin=twin))
    )
    launch = build_launch(tcfg, row.candidate, port=cfg.server.port, log_path="-", trial=row.trial)
    lines = [
        "#!/usr/bin/env bash",
        "# "
        + one_line(
            f"rayspec study {cfg.study.name}, trial {row.trial}, on the digital twin "
            "(simulated): best.sh beside this file is the real SGLang launch."
        ),
        "set -euo pipefail",
        *_launch_lines(launch, "best-twin.sh"),
    ]
    return "\n".join(lines) + "\n"


def write_best(
    cfg: ExperimentConfig,
    report: StudyReport,
    verdict: PlanVerdict | None = None,
    plan: Plan | None = None,
) -> tuple[str, str] | None:
    """Write ``<out>/best.yaml`` and ``<out>/best.sh``; None when no trial completed.

    Args:
        verdict: the per-load plan's verification (:func:`~rayspec.results.plan_verdict`):
            where it recommends the plan, ``best.sh`` launches it and ``best-static.sh`` the
            static pick; otherwise ``best-adaptive.sh`` launches the plan.
        plan: a plan no trial verified (the tiers as the search measured them): written as
            ``best-adaptive.sh``, marked not verified. The verdict's plan wins.
    """
    best = report.best
    if best is None:
        return None
    plan = verdict.plan if verdict is not None else plan
    dcfg = deploy_config(cfg)
    launch = build_launch(dcfg, best.candidate, port=cfg.server.port, log_path="-")
    base = report.baseline
    low, high = interval(best)
    joint = gains(report)[-1]
    tied = tie_note(report, cfg.study.pick_margin)
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
        "tok_s_ci95": None if math.isnan(low) else {"low": round(low, 3), "high": round(high, 3)},
        "tok_s_peak": round(best.tok_s_peak, 3),
        "accept_length": None if math.isnan(best.accept_length) else round(best.accept_length, 4),
        "baseline": None
        if base is None
        else {"trial": base.trial, "config": base.label, "tok_s_mean": round(base.tok_s_mean, 3)},
        # The ratio (1.57: 57 % faster), its 95 % interval, and the text the tables show.
        "vs_baseline": None if math.isnan(joint.ratio) else round(joint.ratio, 4),
        "vs_baseline_ci95": None if math.isnan(joint.low) else {
            "low": round(joint.low, 4), "high": round(joint.high, 4)},
        "vs_baseline_text": None if base is None else vs_baseline(best, base, noise=True),
        "tied_within_noise": tied or None,
        # What best.sh launches: this static pick, or the per-load plan (then best-static.sh
        # launches the pick described here).
        "best_sh": "per-load plan" if plan_recommended(verdict) else "static pick",
        "plan": None if plan is None else {
            "config": plan.candidate().label(),
            "tiers": {str(bs): list(steps) for bs, steps in plan.tiers},
            "nccl_env": dict(plan.nccl_env),
            "verified_by": list(verdict.trials) if verdict is not None else None,
            "recommended": plan_recommended(verdict),
            "why": verdict.why if verdict is not None else "not verified",
            "script": "best.sh" if plan_recommended(verdict) else "best-adaptive.sh",
        },
        "speculative": None if best.candidate.spec is None else {
            "algorithm": best.candidate.spec.algorithm,
            "num_steps": best.candidate.spec.num_steps,
            "eagle_topk": best.candidate.spec.eagle_topk,
            "num_draft_tokens": best.candidate.spec.num_draft_tokens,
            "adaptive": best.candidate.spec.adaptive,
            "overlap": best.candidate.spec.overlap,
        },
        # search.scheduler's knobs the pick sets (None: the server's values, all of them)
        "scheduler": best.candidate.knobs or None,
        "env": redact_env(dict(launch.env)),  # a secret's value is never written
        "unset_env": list(launch.unset_env),
        "argv": list(launch.argv),
    }  # fmt: skip
    folder = StudyFolder(cfg.out_dir)
    os.makedirs(folder.root, exist_ok=True)
    write_text(folder.best_yaml, yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    _write_scripts(cfg, report, tied, verdict, plan)
    if cfg.server.engine is Engine.twin:
        write_text(folder.best_twin_sh, twin_script(cfg, best), mode=0o755)
    elif os.path.exists(folder.best_twin_sh):
        os.remove(folder.best_twin_sh)  # a real study's folder holds no twin line
    return folder.best_yaml, folder.best_sh


def _write_scripts(
    cfg: ExperimentConfig,
    report: StudyReport,
    tied: str,
    verdict: PlanVerdict | None,
    plan: Plan | None,
) -> None:
    """best.sh (the recommendation) and a file for the other option; a stale one removed."""
    folder = StudyFolder(cfg.out_dir)
    best, base = report.best, report.baseline
    assert best is not None
    written: dict[str, str] = {}
    if plan is None:
        written[folder.best_sh] = deploy_script(cfg, best, base, tied=tied)
    else:
        write_text(folder.adaptive_tiers, tiers_json(plan.tiers))
        if plan_recommended(verdict):
            static = "best-static.sh beside this file launches the static pick"
            written[folder.best_sh] = plan_script(cfg, plan, verdict, script="best.sh",
                                                  also=static)  # fmt: skip
            written[folder.best_static_sh] = deploy_script(
                cfg, best, base, tied=tied, script="best-static.sh",
                also="the report recommends the per-load plan instead: best.sh beside this file",
            )  # fmt: skip
        else:
            adaptive = "best-adaptive.sh beside this file launches the per-load plan"
            written[folder.best_sh] = deploy_script(cfg, best, base, tied=tied, also=adaptive)
            written[folder.best_adaptive_sh] = plan_script(cfg, plan, verdict, also=(
                "the report recommends the static pick instead: best.sh beside this file"
            ))  # fmt: skip
    for path, text in written.items():
        write_text(path, text, mode=0o755)
    for stale in (folder.best_static_sh, folder.best_adaptive_sh):
        if stale not in written and os.path.exists(stale):
            os.remove(stale)  # an earlier run's other option: no longer offered
