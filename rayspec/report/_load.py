"""Read a study folder: the Parquet trials, the Optuna study, the NCCL screen, the pick.

Reads only what a study writes (the files :class:`~rayspec.store.StudyFolder` names), through
the packages that own them: the rows through :class:`~rayspec.store.ParquetTrialStore`, the
Optuna study through :func:`rayspec.search.read_stored_study` (read-only, as plain data), so a
report can be rebuilt from a copied folder at any time. Trials are read as
:class:`~rayspec.TrialRecord` s whose candidates are the search space's own
(``SearchSpace.candidate`` of the stored parameters). The configuration table and the pick are
:func:`rayspec.results.build_report`'s, the same the study printed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from dataclasses import field
from typing import TYPE_CHECKING
from typing import Any

from rayspec._exceptions import StoreError
from rayspec._secrets import is_secret
from rayspec._secrets import secret_lines
from rayspec._types import Candidate
from rayspec._types import TrialRecord
from rayspec.results import PLAN_PARAM
from rayspec.results import PLAN_ROLE
from rayspec.results import Plan
from rayspec.results import PlanVerdict
from rayspec.results import StudyReport
from rayspec.results import believes
from rayspec.results import build_report
from rayspec.results import candidate_reader
from rayspec.results import deploy_script
from rayspec.results import load_equivalence
from rayspec.results import load_space
from rayspec.results import plan_recommended
from rayspec.results import plan_script
from rayspec.results import plan_verdict
from rayspec.results import tie_note
from rayspec.search import Equivalence
from rayspec.search import SearchSpace
from rayspec.search import StoredStudy
from rayspec.search import read_stored_study
from rayspec.store import ParquetTrialStore
from rayspec.store import StudyFolder
from rayspec.store import record_of_row

if TYPE_CHECKING:
    from rayspec._config import ExperimentConfig

__all__ = ["StudyData", "load_study_folder", "plan_verdict_of"]

_DEFAULT_START_NOISE = 0.01  # study.start_noise's default, for folders without the attribute


@dataclass(frozen=True)
class StudyData:
    """Everything a report shows, read once.

    Attributes:
        path: the study folder.
        name: the study name.
        rows: the trial rows, in trial order (every column, as users read them).
        records: the same trials typed, in trial order.
        roles: trial -> ``baseline`` / ``enqueued[i]`` (a retry inherits its original's).
        report: the configurations pooled and the pick, as the study printed them.
        attrs: the Optuna study's user attributes (experiment, engine, versions, budget).
        study: the Optuna study as stored (importances evaluated), or None when its storage
            cannot be opened.
        study_note: why ``study`` is None.
        launch: the best configuration's launch script ("" without a pick).
        launch_source: where ``launch`` came from.
        concurrency: scenario -> concurrency (from the request rows).
        categories: the per-category rows of the pick's and the baseline's trials
            (``ParquetTrialStore.category_rows``; empty for a set of one category).
        start_noise, margin: the pick's settings (``study.start_noise``, ``study.pick_margin``).
    """

    path: str
    name: str
    rows: list[dict[str, Any]]
    records: list[TrialRecord]
    roles: dict[int, str]
    report: StudyReport
    attrs: dict[str, Any] = field(default_factory=dict)
    study: StoredStudy | None = None
    study_note: str = ""
    launch: str = ""
    launch_source: str = ""
    concurrency: dict[str, int] = field(default_factory=dict)
    categories: list[dict[str, Any]] = field(default_factory=list)
    start_noise: float = _DEFAULT_START_NOISE
    margin: float = 0.0
    equivalent: Equivalence | None = None
    belief: bool = False  # judged by the belief search's decision (study.sampler: belief)

    def same_nccl(self, a: Candidate, b: Candidate) -> bool:
        """Whether two configurations run the same NCCL set, or sets of one screen class."""
        if self.equivalent is None:
            return a.nccl_env == b.nccl_env
        return self.equivalent(a.nccl_env) == self.equivalent(b.nccl_env)

    def report_at(self, last_trial: int) -> StudyReport:
        """The pick as it stood when trial ``last_trial`` had finished."""
        records = [r for r in self.records if r.trial <= last_trial]
        roles = {t: r for t, r in self.roles.items() if t <= last_trial}
        return build_report(
            records, roles, start_noise=self.start_noise, margin=self.margin,
            equivalent=self.equivalent, belief=self.belief,
        )  # fmt: skip


def _open_study(path: str, name: str) -> tuple[StoredStudy | None, str]:
    """The study in ``<path>/optuna.journal`` (the default storage), or why not."""
    journal = StudyFolder(path).journal
    if not os.path.isfile(journal):
        return None, f"no Optuna journal at {journal} (a study with an RDB storage keeps it there)"
    try:
        study = read_stored_study(journal, name, importances=True)
    except StoreError as exc:
        return None, str(exc)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        return None, f"cannot open {journal}: {exc}"
    if study is None:
        return None, f"{journal} holds studies [], none named {name!r}"
    return study, ""


def _space(path: str, cfg: ExperimentConfig | None, study: StoredStudy | None) -> SearchSpace:
    """The study's search space: the experiment's, the folder's, or (a study written before
    the folder kept it) the choices the Optuna study recorded."""
    if cfg is not None:
        return SearchSpace.from_config(cfg.search)
    space = load_space(path)
    if space is not None:
        return space
    grid = study.user_attrs.get("space") if study is not None else None
    if grid is None:
        missing = os.path.basename(StudyFolder(path).search_space)
        raise StoreError(
            f"{path}: no {missing} and no Optuna study to read the search space from; "
            "run the study again with this rayspec to write it"
        )
    return SearchSpace.from_grid(json.loads(grid))


def _float_attr(attrs: dict[str, Any], key: str, default: float) -> float:
    try:
        value = float(attrs[key])
    except (KeyError, TypeError, ValueError):
        return default
    return value if math.isfinite(value) else default


def load_study_folder(path: str, cfg: ExperimentConfig | None = None) -> StudyData:
    """Read a study folder (``<output.dir>/<study.name>``).

    Args:
        path: the study folder, the one holding ``trials/``.
        cfg: the experiment, when known (the driver passes it): the pick's settings and the
            launch script come from it instead of the folder.

    Raises:
        StoreError: ``path`` is not a study folder, or its trials cannot be read.
    """
    if not os.path.isdir(path):
        raise StoreError(f"{path}: no such folder (expected a study folder holding trials/)")
    store = ParquetTrialStore(path)
    trials = store.trials_dir
    if not os.path.isdir(trials):
        subs = sorted(
            d for d in os.listdir(path) if os.path.isdir(StudyFolder(os.path.join(path, d)).trials)
        )
        hint = f"; its studies: {', '.join(os.path.join(path, d) for d in subs)}" if subs else ""
        raise StoreError(f"{path}: not a study folder (no trials/ in it){hint}")
    rows = store.trial_rows()
    if not rows:
        raise StoreError(f"{trials}: no trial rows yet")
    name = cfg.study.name if cfg is not None else os.path.basename(os.path.abspath(path))
    study, note = _open_study(path, name)
    attrs: dict[str, Any] = dict(study.user_attrs) if study is not None else {}
    if cfg is not None:
        start_noise, margin = cfg.study.start_noise, cfg.study.pick_margin
        belief = believes(cfg)
    else:
        belief = attrs.get("sampler") == "belief"
        start_noise = _float_attr(attrs, "start_noise", _DEFAULT_START_NOISE)
        margin = _float_attr(attrs, "pick_margin", 0.0)
    roles = {int(r["trial"]): str(r["role"]) for r in rows if r.get("role")}
    if study is not None:
        roles = study.roles(roles)
    equivalent = load_equivalence(path)
    read = candidate_reader(_space(path, cfg, study))
    records = [record_of_row(r, read) for r in rows]
    report = build_report(
        records, roles, start_noise=start_noise, margin=margin, equivalent=equivalent,
        belief=belief,
    )  # fmt: skip
    # Only the trials the category table compares: a set of many categories has many rows.
    shown = [t for row in (report.best, report.baseline) if row is not None for t in row.trials]
    categories = store.category_rows(set(shown)) if shown else []
    data = StudyData(
        path=path, name=study.name if study is not None else name, rows=rows,
        records=records, roles=roles,
        report=report, attrs=attrs, study=study, study_note=note,
        concurrency=store.scenario_concurrency(), categories=categories,
        start_noise=start_noise,
        margin=margin, equivalent=equivalent,
    )  # fmt: skip
    # What best.sh launches: the per-load plan where its verification recommends it.
    verdict = plan_verdict_of(data)
    launch, source = "", ""
    if report.best is not None and cfg is not None:
        if verdict is not None and plan_recommended(verdict):
            static = "best-static.sh beside this file launches the static pick"
            launch = plan_script(cfg, verdict.plan, verdict, script="best.sh", also=static)
        else:
            tied = tie_note(report, margin)
            launch = deploy_script(cfg, report.best, report.baseline, tied=tied)
        source = "the experiment"
    elif report.best is not None:
        launch, source = _launch_from_folder(path, rows, report, verdict)
    return dataclasses.replace(data, launch=launch, launch_source=source)


def plan_verdict_of(data: StudyData) -> PlanVerdict | None:
    """The plan's verification from the folder: its loads are the plan's tiers (each a
    closed-loop scenario's concurrency); the objective is the scenario stored unprefixed."""
    plans = [r for r in data.records if r.role == PLAN_ROLE and PLAN_PARAM in r.params]
    if not plans:
        return None
    plan = Plan.from_json(str(max(plans, key=lambda r: r.trial).params[PLAN_PARAM]))
    prefixed = {
        k.split("__", 1)[0] for r in data.records for k in r.result.metrics if "__tok_s_mean" in k
    }
    objective = next((sc for sc in data.concurrency if sc not in prefixed), "")
    loads = []
    for bs, _ in plan.tiers:
        names = sorted(sc for sc, c in data.concurrency.items() if c == bs)
        if names:
            loads.append((objective if objective in names else names[0], bs))
    return plan_verdict(
        data.report, data.records, loads, objective=objective, start_noise=data.start_noise,
        equivalent=data.equivalent,
    )  # fmt: skip


def _launch_from_folder(
    path: str, rows: list[dict[str, Any]], report: StudyReport, verdict: PlanVerdict | None
) -> tuple[str, str]:
    """``best.sh`` when it names what the study recommends (the pick's trial, or the per-load
    plan's verification), else the pick's measured launch line."""
    best = report.best
    if best is None:
        return "", ""
    script = StudyFolder(path).best_sh
    try:
        with open(script, encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        text = ""
    if verdict is not None and plan_recommended(verdict):
        named = f"verified by trial {', '.join(map(str, verdict.trials))} at every load"
        if named in text:
            return text, script
    elif f", trial {best.trial}:" in text:
        return text, script
    row = next((r for r in rows if int(r["trial"]) in best.trials and r.get("command")), None)
    if row is None:
        return "", ""
    import shlex

    env = json.loads(row["env"]) if row.get("env") else {}
    unset = json.loads(row["unset_env"]) if row.get("unset_env") else []
    lines = [f"unset {' '.join(unset)}"] if unset else []
    secrets = sorted(k for k in env if is_secret(k))  # stored redacted: read at run time
    lines += secret_lines(secrets, "this script")
    lines += [
        f"export {k}={shlex.quote(str(v))}" for k, v in sorted(env.items()) if k not in secrets
    ]
    lines.append(" ".join(shlex.quote(a) for a in json.loads(row["command"])))
    return "\n".join(lines) + "\n", f"the measured launch of trial {row['trial']}"
