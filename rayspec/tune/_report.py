"""The end of a study: the configuration to deploy, as files and a table in the field's form.

Reads only the Parquet store's records and the study's search space (``<out>/search_space.json``,
:func:`save_space`), so a report can be rebuilt from a study folder at any time. The table has
one row per configuration: its starts pooled, judged as the search judges them
(:func:`rayspec.search.weigh`), and the pick is :func:`rayspec.search.pick`'s.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from rayspec._config import Engine
from rayspec._config import ExperimentConfig
from rayspec._exceptions import ConfigError
from rayspec._exceptions import FailureReason
from rayspec._exceptions import StoreError
from rayspec._plural import plural
from rayspec._text import one_line
from rayspec._types import Candidate
from rayspec._types import TrialRecord
from rayspec._types import TrialState
from rayspec.engines import deploy_lines
from rayspec.engines import engine_named
from rayspec.search import Equivalence
from rayspec.search import Observation
from rayspec.search import SearchSpace
from rayspec.search import pick
from rayspec.search import prob_better
from rayspec.search import weigh
from rayspec.server import build_launch
from rayspec.tune._checks import GATE_UNCHECKED
from rayspec.tune._decide import cost_key

__all__ = [
    "Row",
    "StudyReport",
    "SPACE_FILE",
    "build_report",
    "candidate_reader",
    "deploy_script",
    "format_table",
    "load_space",
    "observations_from_records",
    "save_space",
    "twin_script",
    "write_best",
]

SPACE_FILE = "search_space.json"


@dataclass(frozen=True)
class Row:
    """One configuration as the report shows it: every start of it pooled.

    Attributes:
        trials: the trials that measured it (its server starts), first first.
        tok_s_mean: the estimate the pick uses (starts pooled, neighbours too; tok/s).
        tok_s_runs: the plain mean of every measured run.
        tok_s_peak: the best run.
        sd: the estimate's relative standard deviation.
        starts, runs: server starts and measured runs pooled.
        reused_by: later trials that asked for the same configuration and reused this
            measurement (no server started for them).
    """

    trials: tuple[int, ...]
    label: str
    candidate: Candidate
    role: str
    tok_s_mean: float
    tok_s_runs: float
    tok_s_peak: float
    accept_length: float
    sd: float
    starts: int
    runs: int
    vs_baseline_confidence: float = math.nan  # P(faster than the baseline)
    per_scenario: tuple[tuple[str, float], ...] = ()
    alarm: str = ""  # the acceptance alarm's hint, when one of its trials raised it
    reused_by: tuple[int, ...] = ()

    @property
    def trial(self) -> int:
        return self.trials[0]

    @property
    def ok(self) -> bool:
        return math.isfinite(self.tok_s_mean)


@dataclass(frozen=True)
class StudyReport:
    rows: tuple[Row, ...]  # measured configurations, best estimate first
    baseline: Row | None
    best: Row | None  # the pick
    failed: int
    pruned: int
    total: int  # trials
    fastest: Row | None = None  # the best estimate (differs from best when a floor held)
    pick_note: str = ""  # why best is not the fastest, when it is not
    best_per_scenario: tuple[tuple[str, Row], ...] = ()
    bench_s_saved: float = 0.0
    reused: int = 0  # trials that repeated a measured configuration (no server started)
    restarts: int = 0  # server launches
    failures: tuple[tuple[int, str, str], ...] = ()  # (trial, config, reason)


def _f(value: Any) -> float:
    return float(value) if value is not None else math.nan


def candidate_reader(space: SearchSpace) -> Callable[[Mapping[str, Any]], Candidate]:
    """``space.candidate`` for stored parameters: the one reader of a trial's parameters.

    A trial that never got parameters (a driver killed before it asked) is the baseline.
    """

    def candidate(params: Mapping[str, Any]) -> Candidate:
        if not params:
            return Candidate()
        try:
            return space.candidate(params)
        except ConfigError as exc:
            raise StoreError(f"stored parameters {dict(params)} are not of this search space: "
                             f"{exc}") from exc  # fmt: skip

    return candidate


def save_space(out_dir: str, space: SearchSpace) -> str:
    """Write ``<out>/search_space.json``: the report reads candidates back through it."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, SPACE_FILE)
    _write_text(path, space.to_json() + "\n")
    return path


def load_space(out_dir: str) -> SearchSpace | None:
    """The space :func:`save_space` wrote (None when the folder has none).

    Raises:
        StoreError: the file is there but is not a search space.
    """
    path = os.path.join(out_dir, SPACE_FILE)
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreError(f"cannot read {path}: {exc}") from exc
    try:
        return SearchSpace.from_json(text)
    except ConfigError as exc:
        raise StoreError(f"{path}: {exc}") from exc


def observations_from_records(
    records: Sequence[TrialRecord], roles: dict[int, str]
) -> list[Observation]:
    """The stored trials as the search sees them, in trial order."""
    out = []
    for r in sorted(records, key=lambda r: r.trial):
        out.append(
            Observation(
                trial=r.trial,
                candidate=r.candidate,
                state=r.result.state,
                runs=r.run_values,
                failure=r.result.failure,
                role=roles.get(r.trial, r.role),
                launched=r.launched,
                accept_length=_f(r.result.metrics.get("accept_length")),
            )
        )
    return out


def build_report(
    records: Sequence[TrialRecord],
    roles: dict[int, str],
    *,
    start_noise: float = 0.01,
    margin: float = 0.0,
    equivalent: Equivalence | None = None,
) -> StudyReport:
    """Pool each configuration's starts and pick the configuration to deploy.

    Args:
        records: the stored trials (``ParquetTrialStore.load_records``).
        roles: trial number -> "baseline" / "enqueued[i]" for the configurations tried first.
        start_noise: the prior between-start noise (``study.start_noise``).
        margin: ``study.pick_margin`` (0: the best estimate, guarded by the floors).
        equivalent: the NCCL screen's classes (equivalent sets pool into one configuration).
    """
    observations = observations_from_records(records, roles)
    evidence = weigh(observations, start_noise=start_noise, equivalent=equivalent)
    by_trial = {r.trial: r for r in records}
    scenarios = sorted(
        {k.split("__", 1)[0] for r in records for k in r.result.metrics if "__tok_s_mean" in k}
    )
    # A reused result is a row of its own with a note and no runs; it belongs to the
    # configuration (same candidate key) whose measurement it repeated.
    reused: dict[str, list[int]] = {}
    for r in records:
        if r.reused and r.result.state is TrialState.COMPLETE and r.candidate_key:
            reused.setdefault(r.candidate_key, []).append(r.trial)
    rows: dict[str, Row] = {}
    for key, point in evidence.points.items():
        trials = point.trials
        measured = [by_trial[t] for t in trials]
        runs = [v for r in measured for v in r.run_values if math.isfinite(v)]
        accepts = [_f(r.result.metrics.get("accept_length")) for r in measured]
        accepts = [a for a in accepts if math.isfinite(a)]
        role = next((roles[t] for t in trials if t in roles), "")
        rows[key] = Row(
            trials=trials,
            label=point.candidate.label(),
            candidate=point.candidate,
            role=role,
            tok_s_mean=point.estimate.mean,
            tok_s_runs=sum(runs) / len(runs) if runs else math.nan,
            tok_s_peak=max(runs) if runs else math.nan,
            accept_length=sum(accepts) / len(accepts) if accepts else math.nan,
            sd=point.estimate.sd,
            starts=point.estimate.starts,
            runs=point.estimate.runs,
            per_scenario=tuple(
                (sc, _mean([_f(r.result.metrics.get(f"{sc}__tok_s_mean")) for r in measured]))
                for sc in scenarios
            ),
            reused_by=tuple(sorted(
                {t for r in measured for t in reused.get(r.candidate_key, ())}
            )),
        )  # fmt: skip
    baseline_key = next((k for k, r in rows.items() if r.role == "baseline"), None)
    if baseline_key is not None:
        base = evidence.points[baseline_key].estimate
        rows = {
            k: dataclasses.replace(r, vs_baseline_confidence=prob_better(
                evidence.points[k].estimate, base))
            for k, r in rows.items()
        }  # fmt: skip
    # A configuration the correctness gate was on for but never compared is not deployable.
    unchecked = {
        k for k, p in evidence.points.items()
        if any(_f(by_trial[t].result.metrics.get(GATE_UNCHECKED)) == 1.0 for t in p.trials)
        and not any(math.isfinite(_f(by_trial[t].result.metrics.get("gate_compared")))
                    for t in p.trials)
        and k != baseline_key
    }  # fmt: skip
    complete = {k: p for k, p in evidence.points.items() if p.complete and k not in unchecked}
    cost = {k: cost_key(p.candidate) for k, p in complete.items()}
    choice = pick(complete, cheaper_margin=margin, cost=cost)
    ranked = sorted(rows.values(), key=lambda r: (-r.tok_s_mean, r.trial))
    per_scenario = []
    for i, sc in enumerate(scenarios):
        ranked_sc = [r for r in ranked if math.isfinite(r.per_scenario[i][1])]
        if ranked_sc:
            per_scenario.append((sc, max(ranked_sc, key=lambda r: r.per_scenario[i][1])))
    states = [r.result.state for r in records]
    saved = sum(
        _f(r.result.metrics.get("bench_s_saved"))
        for r in records
        if r.result.state is TrialState.PRUNED
    )
    failures = tuple(
        (r.trial, r.candidate.label(), str(r.result.failure or "unknown"))
        for r in sorted(records, key=lambda r: r.trial)
        if r.result.state is TrialState.FAIL
        and r.result.failure != FailureReason.INTERRUPTED.value
    )
    return StudyReport(
        rows=tuple(ranked),
        baseline=rows.get(baseline_key) if baseline_key else None,
        best=rows[choice.point.key] if choice else None,
        fastest=rows[choice.best.key] if choice else None,
        pick_note=choice.note if choice else _unchecked_note(unchecked, rows),
        failed=len(failures),
        pruned=states.count(TrialState.PRUNED),
        total=len(records),
        reused=sum(1 for r in records if r.reused),
        restarts=sum(1 for r in records if r.launched),
        best_per_scenario=tuple(per_scenario),
        bench_s_saved=0.0 if math.isnan(saved) else saved,
        failures=failures,
    )


def _unchecked_note(unchecked: set[str], rows: Mapping[str, Row]) -> str:
    """Why nothing was picked when only unchecked configurations were measured."""
    if not unchecked:
        return ""
    trials = sorted(t for k in unchecked for t in rows[k].trials)
    return (
        f"no pick: the correctness gate compared none of the outputs of trials "
        f"{', '.join(map(str, trials))} (no baseline reference), and an unchecked configuration "
        "is never picked; restore the baseline's request file or start a new study"
    )


def _mean(values: list[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else math.nan


def _vs(row: Row, baseline: Row | None) -> str:
    if baseline is None or row.trials == baseline.trials:
        return "—"
    text = f"{(row.tok_s_mean / baseline.tok_s_mean - 1) * 100:+.1f} %"
    if 0.05 < row.vs_baseline_confidence < 0.95:
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
    """The field table's form, one row per configuration, best estimate first.

    ``tok/s`` is the estimate the pick uses (all starts pooled); ``starts x runs`` says how much
    it rests on.
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
        lines.append(
            f"| {trials} | {r.label}{tag} | {r.tok_s_mean:.1f} | {r.tok_s_peak:.1f} | {acc} | "
            f"{r.starts} x {r.runs // max(1, r.starts)} | {_vs(r, report.baseline)} |"
        )
    for trial, label, reason in report.failures[:5]:
        lines.append(f"| {trial} | {label} | failed: {reason} | | | | |")
    if len(report.failures) > 5:
        lines.append(f"| … | {len(report.failures) - 5} more failed trials | | | | | |")
    return "\n".join(lines)


MODEL_PLACEHOLDER = "${MODEL_PATH}"
DRAFT_PLACEHOLDER = "${DRAFT_MODEL_PATH}"
TWIN_SCRIPT = "best-twin.sh"  # a twin study's pick, served by the twin where the study ran


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


def deploy_script(cfg: ExperimentConfig, row: Row, baseline: Row | None) -> str:
    """A bash script with the exact environment and ``python -m sglang.launch_server`` line."""
    dcfg = deploy_config(cfg)
    launch = build_launch(dcfg, row.candidate, port=cfg.server.port, log_path="-")
    placeholders = {
        MODEL_PLACEHOLDER: '"${MODEL_PATH:?set MODEL_PATH to the target model}"',
        DRAFT_PLACEHOLDER: '"${DRAFT_MODEL_PATH:?set DRAFT_MODEL_PATH to the EAGLE-3 drafter}"',
    }
    vs = _vs(row, baseline)
    # Comment lines are written through one_line: a line break in a value would end the
    # comment and make the rest a command of the script.
    comments = [
        f"rayspec study {cfg.study.name}, trial {row.trial}: {row.label}",
        f"{row.tok_s_mean:.1f} tok/s ({plural(row.starts, 'server start')} x "
        f"{plural(row.runs // max(1, row.starts), 'run')} pooled), {row.tok_s_peak:.1f} peak, "
        f"{vs} vs baseline" + (f" ({baseline.tok_s_mean:.1f} tok/s)" if baseline else ""),
    ]
    if cfg.server.engine is Engine.twin:
        comments.append(
            f"MEASURED ON THE DIGITAL TWIN (profile {cfg.server.twin.profile}), not on GPUs: "
            "re-measure on a real node before deploying."
        )
        comments.append(f"Without GPUs: {TWIN_SCRIPT} beside this file serves it on the twin.")
    lines = ["#!/usr/bin/env bash", *(f"# {one_line(text)}" for text in comments)]
    lines += ["set -euo pipefail", *deploy_lines(launch, placeholders)]
    return "\n".join(lines) + "\n"


def twin_script(cfg: ExperimentConfig, row: Row) -> str:
    """A twin study's pick on the twin, where the study ran: ``python -m rayspec.twin.server``
    with best.sh's flags and environment, the study's interpreter, no injected fault."""
    twin = dataclasses.replace(cfg.server.twin, fault="")
    tcfg = dataclasses.replace(cfg, server=dataclasses.replace(cfg.server, twin=twin))
    launch = build_launch(tcfg, row.candidate, port=cfg.server.port, log_path="-", trial=row.trial)
    lines = [
        "#!/usr/bin/env bash",
        "# "
        + one_line(
            f"rayspec study {cfg.study.name}, trial {row.trial}, on the digital twin "
            "(simulated): best.sh beside this file is the real SGLang launch."
        ),
        "set -euo pipefail",
        *deploy_lines(launch),
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
            "adaptive": best.candidate.spec.adaptive,
            "overlap": best.candidate.spec.overlap,
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
    twin_path = os.path.join(out, TWIN_SCRIPT)
    if cfg.server.engine is Engine.twin:
        _write_text(twin_path, twin_script(cfg, best))
        os.chmod(twin_path, 0o755)
    elif os.path.exists(twin_path):
        os.remove(twin_path)  # a real study's folder holds no twin line
    return yaml_path, sh_path


def _write_text(path: str, text: str) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)
