"""The Optuna study: storage, sampler, resume and the one place a trial's outcome is told.

Only this package imports optuna. It uses the public ask/tell API and ``suggest_*`` only.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

import optuna
from optuna.samplers import BaseSampler
from optuna.storages import BaseStorage
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from rayspec._config import ExperimentConfig
from rayspec._config import Sampler
from rayspec._exceptions import ConfigError
from rayspec._types import TrialResult
from rayspec.search._space import ATTR_QUEUED
from rayspec.search._space import SearchSpace
from rayspec.search._space import canonical_key

__all__ = [
    "ATTR_FAILURE",
    "ATTR_RETRY_OF",
    "ATTR_KEY",
    "StudyHandle",
    "open_study",
]

_log = logging.getLogger(__name__)

ATTR_KEY = "candidate_key"
ATTR_LABEL = "candidate"
ATTR_FAILURE = "failure_reason"
ATTR_RETRY_OF = "retry_of"
ATTR_REUSED_FROM = "reused_from"
_FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _make_storage(url: str) -> BaseStorage | str:
    if "://" in url:  # sqlite:///..., postgresql://...: an RDB URL
        return url
    parent = os.path.dirname(os.path.abspath(url))
    os.makedirs(parent, exist_ok=True)
    return JournalStorage(JournalFileBackend(url))


def _make_sampler(cfg: ExperimentConfig, space: SearchSpace) -> BaseSampler:
    seed = cfg.study.seed
    if cfg.study.sampler is Sampler.tpe:
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=cfg.study.n_startup_trials)
    if cfg.study.sampler is Sampler.random:
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.GridSampler(space.grid(), seed=seed)


class StudyHandle:
    """An opened (created or resumed) study plus the bookkeeping the driver needs."""

    def __init__(self, study: optuna.Study, space: SearchSpace, cfg: ExperimentConfig) -> None:
        self.study = study
        self.space = space
        self.cfg = cfg

    # -- counting -------------------------------------------------------------------------
    def interrupted(self) -> set[int]:
        """Numbers of trials a killed driver left running (each was enqueued again)."""
        return {
            int(t.user_attrs[ATTR_RETRY_OF])
            for t in self.study.get_trials(deepcopy=False)
            if ATTR_RETRY_OF in t.user_attrs
        }

    def finished(self) -> list[FrozenTrial]:
        """Trials with an outcome (interrupted ones excluded: they are tried again)."""
        skip = self.interrupted()
        return [
            t
            for t in self.study.get_trials(deepcopy=False, states=_FINISHED)
            if t.number not in skip
        ]

    def remaining(self, n_trials: int) -> int:
        return max(0, n_trials - len(self.finished()))

    def exhausted(self) -> bool:
        sampler = self.study.sampler
        return isinstance(sampler, optuna.samplers.GridSampler) and sampler.is_exhausted(
            self.study
        )

    def completed_by_key(self) -> dict[str, FrozenTrial]:
        """The first COMPLETE trial of each canonical candidate."""
        seen: dict[str, FrozenTrial] = {}
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            key = t.user_attrs.get(ATTR_KEY)
            if key and key not in seen:
                seen[key] = t
        return seen

    # -- ask / tell -----------------------------------------------------------------------
    def ask(self) -> tuple[optuna.Trial, Any]:
        """A new trial and its candidate."""
        trial = self.study.ask()
        try:
            candidate = self.space.suggest(trial)
        except ValueError as exc:  # e.g. Optuna refusing choices that differ from the stored
            self.study.tell(trial, state=TrialState.FAIL)
            raise ConfigError(
                f"search: cannot sample study {self.cfg.study.name!r}: {exc}"
            ) from exc
        trial.set_user_attr(ATTR_KEY, canonical_key(candidate))
        trial.set_user_attr(ATTR_LABEL, candidate.label())
        return trial, candidate

    def tell(self, trial: optuna.Trial | int, result: TrialResult) -> None:
        """Record ``result`` in the study: the one place an outcome becomes a trial state."""
        number = trial if isinstance(trial, int) else trial.number
        if not isinstance(trial, int):
            self._set_attrs(trial, result)
        state = {
            "COMPLETE": TrialState.COMPLETE,
            "PRUNED": TrialState.PRUNED,
            "FAIL": TrialState.FAIL,
        }[result.state]
        values = result.value if state is TrialState.COMPLETE else None
        try:
            self.study.tell(number, values, state=state, skip_if_finished=True)
        except RuntimeError as exc:
            # GridSampler calls Study.stop() on the tell that uses up the grid; the trial is
            # stored as COMPLETE all the same (stack-notes §4.5).
            if "Study.stop" not in str(exc):
                raise

    @staticmethod
    def _set_attrs(trial: optuna.Trial, result: TrialResult) -> None:
        trial.set_user_attr("state", result.state)
        if result.failure:
            trial.set_user_attr(ATTR_FAILURE, result.failure)
            trial.set_user_attr("failure_detail", result.failure_detail[:2000])
            trial.set_user_attr("log_tail", result.log_tail[-4000:])
        for key in ("tok_s_mean", "tok_s_peak", "tok_s_std", "accept_length"):
            value = result.metrics.get(key)
            if value is not None and value == value:  # not NaN
                trial.set_user_attr(key, float(value))
        if result.launch is not None:
            trial.set_user_attr("engine", result.launch.engine)

    def enqueue(self, params: Mapping[str, Any], **attrs: Any) -> None:
        """Queue a configuration; parameters left out mean unset (NCCL) or off (flags)."""
        complete = self.space.params_of(self.space.candidate(self.space.coerce(params)))
        attrs = {**attrs, ATTR_QUEUED: complete}
        self.study.enqueue_trial(complete, user_attrs=attrs, skip_if_exists=False)

    def seed(self) -> None:
        """Queue the baseline, then ``study.enqueue``, before anything the sampler picks.

        Idempotent and resumable: each configuration carries its role, and only the roles the
        study does not hold yet are queued, in order. A driver killed half-way through seeding
        loses none. Once the sampler has proposed a trial the study counts as seeded.
        """
        if self.study.user_attrs.get("seeded"):
            return
        trials = self.study.get_trials(deepcopy=False)
        if any("role" not in t.user_attrs and ATTR_RETRY_OF not in t.user_attrs for t in trials):
            self.study.set_user_attr("seeded", True)  # an older study, already past seeding
            return
        have = {t.user_attrs.get("role") for t in trials}
        wanted = [("baseline", self.space.params_of(self.space.baseline()))]
        wanted += [(f"enqueued[{i}]", p) for i, p in enumerate(self.cfg.study.enqueue)]
        for role, params in wanted:
            if role in have:
                continue
            try:
                self.enqueue(params, role=role)
            except ConfigError as exc:
                key = (
                    "study.enqueue" + role.removeprefix("enqueued")
                    if role != "baseline"
                    else "study"
                )
                raise ConfigError(f"{key}.{exc}") from exc
        self.study.set_user_attr("seeded", True)

    # -- resume ---------------------------------------------------------------------------
    def running(self) -> list[FrozenTrial]:
        """Trials left RUNNING: by a killed driver, when this driver is the only writer."""
        return self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))

    def requeue(self, trial: FrozenTrial) -> None:
        """Queue an interrupted trial's configuration again, once (idempotent).

        The retry's ``retry_of`` attribute is what marks ``trial`` as interrupted.
        """
        if trial.number in self.interrupted():
            return
        params = dict(trial.params)
        self.study.enqueue_trial(
            params, user_attrs={ATTR_RETRY_OF: trial.number, ATTR_QUEUED: params}
        )

    def fail(self, number: int) -> None:
        """Mark a trial FAIL (no-op when it already finished)."""
        self.study.tell(number, state=TrialState.FAIL, skip_if_finished=True)


def open_study(cfg: ExperimentConfig, space: SearchSpace) -> StudyHandle:
    """Create the study, or resume it from its storage.

    A new study enqueues the baseline (no speculation, NCCL unset) first, then the
    configurations of ``study.enqueue`` in order, before anything the sampler picks.

    Raises:
        ConfigError: the storage holds this study from an experiment with another engine.
    """
    storage = _make_storage(cfg.storage_url)
    sampler = _make_sampler(cfg, space)
    study = optuna.create_study(
        study_name=cfg.study.name,
        storage=storage,
        sampler=sampler,
        direction="maximize",
        load_if_exists=True,
    )
    handle = StudyHandle(study, space, cfg)
    if "engine" not in study.user_attrs:
        study.set_user_attr("engine", cfg.server.engine.value)
        study.set_user_attr("space", space_fingerprint(space))
        study.set_user_attr("objective", f"{cfg.study.objective} (output tok/s)")
    _check_same_experiment(cfg, space, study.user_attrs)
    _check_stored_choices(cfg, space, study.get_trials(deepcopy=False))
    handle.seed()
    return handle


def space_fingerprint(space: SearchSpace) -> str:
    """The searched parameters and their choices: Optuna cannot resume across a change."""
    return json.dumps(space.grid(), sort_keys=True)


def _check_same_experiment(
    cfg: ExperimentConfig, space: SearchSpace, attrs: Mapping[str, Any]
) -> None:
    where = f"study {cfg.study.name!r} in {cfg.storage_url}"
    engine = cfg.server.engine.value
    if attrs.get("engine", engine) != engine:
        raise ConfigError(
            f"study.name: {where} was run with engine {attrs['engine']}; choose another "
            f"study.name for engine {engine}"
        )
    stored = attrs.get("space")
    if stored is not None and stored != space_fingerprint(space):
        old, new = json.loads(stored), space.grid()
        changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        raise ConfigError(
            f"search: {where} was created with other choices for {', '.join(changed)}; "
            "restore them or choose another study.name (Optuna cannot resume a changed space)"
        )


def _check_stored_choices(
    cfg: ExperimentConfig, space: SearchSpace, trials: list[FrozenTrial]
) -> None:
    """Every parameter the stored trials used must have the same choices in this space."""
    ours: dict[str, list[Any]] = dict(space.grid())
    for k in space.num_steps:
        for m in space.eagle_topk:
            name, budgets = space.ndt_param(k, m)
            ours[name] = list(budgets)
    changed = set()
    for t in trials:
        for name, dist in t.distributions.items():
            choices = getattr(dist, "choices", None)
            if name in ours and choices is not None and list(choices) != ours[name]:
                changed.add(name)
            elif name not in ours:
                changed.add(name)
    if changed:
        raise ConfigError(
            f"search: study {cfg.study.name!r} in {cfg.storage_url} was created with other "
            f"choices for {', '.join(sorted(changed))}; restore them or choose another "
            "study.name (Optuna cannot resume a changed space)"
        )


def check_resumable(cfg: ExperimentConfig, space: SearchSpace) -> None:
    """Before anything starts: refuse to resume a stored study of another experiment."""
    url = cfg.storage_url
    if "://" not in url and not os.path.exists(url):
        return
    try:
        stored = optuna.load_study(study_name=cfg.study.name, storage=_make_storage(url))
    except KeyError:  # no study of that name in the storage yet
        return
    _check_same_experiment(cfg, space, stored.user_attrs)
    _check_stored_choices(cfg, space, stored.get_trials(deepcopy=False))


def validate_enqueue(cfg: ExperimentConfig, space: SearchSpace) -> None:
    """Check ``study.enqueue`` against the space before anything starts."""
    for i, params in enumerate(cfg.study.enqueue):
        try:
            space.candidate(space.coerce(params))
        except ConfigError as exc:
            raise ConfigError(f"study.enqueue[{i}].{exc}") from exc
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"study.enqueue[{i}]: {exc}") from exc
