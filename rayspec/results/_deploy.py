"""The files a study hands the user: ``best.yaml`` (the pick as data), ``best.sh`` (the pick as
the real SGLang launch) and, for a twin study, ``best-twin.sh`` (the pick on the twin).

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
from rayspec.results._saved import write_text
from rayspec.results._sure import above_peak
from rayspec.results._sure import gains
from rayspec.results._sure import interval
from rayspec.results._sure import tie_note
from rayspec.results._table import Row
from rayspec.results._table import StudyReport
from rayspec.results._table import vs_baseline
from rayspec.server import build_launch
from rayspec.store import StudyFolder
from rayspec.twin import available_profiles

__all__ = [
    "DRAFT_PLACEHOLDER",
    "MODEL_PLACEHOLDER",
    "deploy_config",
    "deploy_script",
    "twin_script",
    "write_best",
]

MODEL_PLACEHOLDER = "${MODEL_PATH}"
DRAFT_PLACEHOLDER = "${DRAFT_MODEL_PATH}"


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


def deploy_script(cfg: ExperimentConfig, row: Row, baseline: Row | None, *, tied: str = "") -> str:
    """A bash script with the exact environment and ``python -m sglang.launch_server`` line.

    Args:
        tied: :func:`~rayspec.results.tie_note` of the study (the pick tied within noise, and
            the rule that chose): a comment line of its own.
    """
    dcfg = deploy_config(cfg)
    launch = build_launch(dcfg, row.candidate, port=cfg.server.port, log_path="-")
    placeholders = {
        MODEL_PLACEHOLDER: '"${MODEL_PATH:?set MODEL_PATH to the target model}"',
        DRAFT_PLACEHOLDER: '"${DRAFT_MODEL_PATH:?set DRAFT_MODEL_PATH to the EAGLE-3 drafter}"',
    }
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
    if cfg.server.engine is Engine.twin:
        comments.append(
            f"MEASURED ON THE DIGITAL TWIN (profile {cfg.server.twin.profile}), not on GPUs: "
            "re-measure on a real node before deploying."
        )
        twin_sh = os.path.basename(StudyFolder(cfg.out_dir).best_twin_sh)
        comments.append(f"Without GPUs: {twin_sh} beside this file serves it on the twin.")
    lines = ["#!/usr/bin/env bash", *(f"# {one_line(text)}" for text in comments)]
    lines += ["set -euo pipefail", *_launch_lines(launch, "best.sh", placeholders)]
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


def write_best(cfg: ExperimentConfig, report: StudyReport) -> tuple[str, str] | None:
    """Write ``<out>/best.yaml`` and ``<out>/best.sh``; None when no trial completed."""
    best = report.best
    if best is None:
        return None
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
    write_text(folder.best_sh, deploy_script(cfg, best, base, tied=tied), mode=0o755)
    if cfg.server.engine is Engine.twin:
        write_text(folder.best_twin_sh, twin_script(cfg, best), mode=0o755)
    elif os.path.exists(folder.best_twin_sh):
        os.remove(folder.best_twin_sh)  # a real study's folder holds no twin line
    return folder.best_yaml, folder.best_sh
