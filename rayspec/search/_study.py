"""The Optuna study: storage, sampler, resume, and the one place a trial's outcome is told.

This module is the only one that writes to Optuna (``_stored.py`` reads a stored study back
without writing). The driver sees a :class:`StudyHandle` and the :class:`TrialHandle` it hands
out; Optuna's public ask/tell API and ``suggest_*`` are all that is used.

How outcomes are told (:meth:`StudyHandle.tell`):

- COMPLETE: the objective value.
- PRUNED: Optuna's PRUNED (the running mean was reported as intermediate values).
- FAIL of a configuration (a launch failure, an impossible draft tree): COMPLETE with value 0
  and the constraint ``failed = 1``. Optuna's samplers read constraints (TPE ranks infeasible
  trials below every feasible one), so a configuration that cannot run teaches the sampler to
  stay away; ``study.best_trial`` and optuna-dashboard show the trial as infeasible. The
  Parquet row and the ``state`` user attribute keep rayspec's FAIL and its reason.
- A measured trial (COMPLETE, PRUNED) of a study with ``study.slo`` also carries the
  constraint ``slo``: its ``slo_violation`` (the largest p99 / limit - 1; > 0 misses the SLO),
  so TPE ranks a configuration that misses the SLO below every one that meets it.
- FAIL because the driver stopped (interrupted) or the trial's node died (node_lost): Optuna's
  FAIL; the configuration is queued again (a lost node's trial once), and says nothing about
  the configuration.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import optuna
from optuna.samplers import BaseSampler
from optuna.storages import BaseStorage
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.study import Study
from optuna.trial import FrozenTrial
from optuna.trial import TrialState as OptunaState

from rayspec._config import Engine
from rayspec._config import ExperimentConfig
from rayspec._config import Sampler
from rayspec._exceptions import NOT_THE_CONFIG
from rayspec._exceptions import ConfigError
from rayspec._plural import plural
from rayspec._secrets import redact_env
from rayspec._types import Candidate
from rayspec._types import TrialRecord
from rayspec._types import TrialResult
from rayspec._types import TrialState
from rayspec.search._journal import check_journal
from rayspec.search._resume import ATTR_MEASURED_WITH
from rayspec.search._resume import check_grid
from rayspec.search._resume import check_same_experiment
from rayspec.search._resume import check_stored_choices
from rayspec.search._resume import measurement_fingerprint
from rayspec.search._resume import space_fingerprint
from rayspec.search._space import ATTR_QUEUED
from rayspec.search._space import SearchSpace
from rayspec.search._space import canonical_key
from rayspec.search._stored import ATTR_RETRY_OF
from rayspec.search._stored import ATTR_ROLE
from rayspec.search._stored import StoredTrial
from rayspec.search._stored import stored_roles

__all__ = [
    "ATTR_FAILURE",
    "ATTR_KEY",
    "ATTR_RETRY_OF",
    "CONSTRAINT_SLO",
    "StoredTrial",
    "StudyHandle",
    "TrialHandle",
    "open_study",
]

_log = logging.getLogger(__name__)

ATTR_KEY = "candidate_key"
ATTR_LABEL = "candidate"
ATTR_FAILURE = "failure_reason"
ATTR_REUSED_FROM = "reused_from"
ATTR_REASON = "reason"
ATTR_REPEAT_OF = "repeat_of"
ATTR_NODE_RETRY = "node_lost_retry"  # a retry of a trial whose node died (retried only once)
# What the journal keeps of a trial's Parquet row, so that a lost trial file can be rebuilt.
ATTR_RUN_VALUES = "run_values"
ATTR_RESTART = "restart"
ATTR_LAUNCH = "launch"
ATTR_OUTSIDE = "outside_params"  # a trial outside the space (a plan's): its stored parameters
# A measured trial whose row a stopping driver wrote while it awaited the baseline's outputs
# (the correctness gate's reference): left RUNNING, recorded by the next driver once it has them.
ATTR_AWAITS = "awaits_reference"
ROLE_BASELINE_AGAIN = "baseline#2"
CONSTRAINT_FAILED = "failed"
CONSTRAINT_SLO = "slo"  # study.slo: the trial's slo_violation (> 0: infeasible)
# Trial metrics copied to each trial's user attributes (optuna-dashboard shows them; a trial
# file rebuilt from the journal has them).
TRIAL_METRIC_ATTRS = (
    "tok_s_mean", "tok_s_peak", "tok_s_std", "tok_s_ci95_low", "tok_s_ci95_high",
    "accept_length", "runs", "vs_baseline_ratio", "gate_compared", "gate_diverged_early",
    "gate_unchecked", "goodput", "slo_violation",
)  # fmt: skip
_FINISHED = (OptunaState.COMPLETE, OptunaState.PRUNED, OptunaState.FAIL)

optuna.logging.set_verbosity(optuna.logging.WARNING)


class _AskTellGridSampler(optuna.samplers.GridSampler):
    """Optuna's GridSampler over a list of points, for ask/tell.

    Optuna's grid is the product of its parameters' choices, and every parameter a trial
    suggests must be in it; rayspec's space is conditional (the draft-token parameter exists
    for trees only, named by the tree; ``spec.overlap`` for topk 1 only), so no product fits
    it. This grid is :meth:`SearchSpace.grid_points`: each grid id one launchable
    configuration, and a trial's parameters are the ones :meth:`SearchSpace.suggest` asks (what
    optuna-dashboard shows), a parameter a point does not use being absent. Everything else is
    GridSampler's: the shuffle by ``seed``, the ``grid_id`` and ``search_space`` system
    attributes, :meth:`is_exhausted`. A space without conditional parameters gets Optuna's own
    grid, point for point and id for id (a study of the old product grid resumes).

    GridSampler keeps its grid in private attributes, which this constructor sets;
    ``tests/search_tests/test_study.py`` pins that against the installed Optuna.

    Its ``study.stop()`` on the last tell is left out: under ask/tell that call raises; the study
    loop checks :meth:`is_exhausted` before each ask instead.
    """

    def __init__(self, points: Sequence[Mapping[str, Any]], seed: int | None = None) -> None:
        super().__init__({}, seed=seed)
        names = sorted({name for point in points for name in point})
        self._search_space = {
            name: list(dict.fromkeys(p[name] for p in points if name in p)) for name in names
        }
        self._param_names = names
        self._all_grids = [tuple(p.get(name) for name in names) for p in points]
        self._n_min_trials = len(self._all_grids)
        self._rng.rng.seed(seed or 0)  # as GridSampler's own: the same points, the same order
        self._rng.rng.shuffle(self._all_grids)  # type: ignore[arg-type]

    @property
    def n_points(self) -> int:
        return self._n_min_trials

    def after_trial(
        self,
        study: Study,
        trial: FrozenTrial,
        state: OptunaState,
        values: Sequence[float] | None,
    ) -> None:
        del study, trial, state, values


def _make_storage(url: str) -> BaseStorage | str:
    if "://" in url:  # sqlite:///..., postgresql://...: an RDB URL
        return url
    parent = os.path.dirname(os.path.abspath(url))
    os.makedirs(parent, exist_ok=True)
    if os.path.isfile(url):
        check_journal(url)  # damage Optuna cannot read past: one line, not a traceback
    return JournalStorage(JournalFileBackend(url))


def _make_sampler(cfg: ExperimentConfig, space: SearchSpace) -> BaseSampler:
    seed = cfg.study.seed
    if cfg.study.sampler is Sampler.tpe:
        return optuna.samplers.TPESampler(seed=seed, n_startup_trials=cfg.study.n_startup_trials)
    if cfg.study.sampler is Sampler.grid:
        check_grid(cfg, space)
        return _AskTellGridSampler(space.grid_points(), seed=seed)
    # random, and structured (whose trials are all queued; the sampler only fills gaps).
    return optuna.samplers.RandomSampler(seed=seed)


class TrialHandle:
    """A running trial as rayspec sees it: number, candidate, role, and a way to report.

    Handed out by :meth:`StudyHandle.ask`; the driver never sees the Optuna trial inside.

    Attributes:
        number: the trial number (names the Parquet row, the log and the actors).
        candidate: what to launch.
        role: ``baseline``, ``enqueued[i]``, or ``""`` for a configuration the search chose.
        reason: why the search chose it (empty for the baseline and enqueued ones).
        repeat_of: a deliberate new start of the configuration of that trial.
        retry_of: a retry of that trial, which the last driver left unfinished.
    """

    def __init__(
        self,
        trial: optuna.Trial,
        candidate: Candidate,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        self._trial = trial
        self._params = None if params is None else dict(params)
        self.number: int = trial.number
        self.candidate = candidate
        attrs = trial.user_attrs
        self.role: str = str(attrs.get(ATTR_ROLE, ""))
        self.reason: str = str(attrs.get(ATTR_REASON, ""))
        repeat = attrs.get(ATTR_REPEAT_OF)
        retry = attrs.get(ATTR_RETRY_OF)
        self.repeat_of: int | None = None if repeat is None else int(repeat)
        self.retry_of: int | None = None if retry is None else int(retry)

    @property
    def params(self) -> dict[str, Any]:
        """The trial's parameters (a trial outside the space: the ones it was given)."""
        return dict(self._trial.params if self._params is None else self._params)

    @property
    def attrs(self) -> dict[str, Any]:
        return dict(self._trial.user_attrs)

    def set_attr(self, key: str, value: Any) -> None:
        self._trial.set_user_attr(key, value)

    def report(self, value: float, step: int) -> None:
        """The running objective after ``step`` runs (Optuna's intermediate value)."""
        self._trial.report(value, step=step)


class StudyHandle:
    """An opened (created or resumed) study: ask, tell, roles and resume bookkeeping."""

    def __init__(self, study: optuna.Study, space: SearchSpace, cfg: ExperimentConfig) -> None:
        self._study = study
        self.space = space
        self.cfg = cfg

    # -- reading ---------------------------------------------------------------------------
    def trials(self) -> list[StoredTrial]:
        return [StoredTrial(t) for t in self._study.get_trials(deepcopy=False)]

    def interrupted(self) -> set[int]:
        """Numbers of trials a killed driver left running (each was queued again)."""
        return {
            int(t.user_attrs[ATTR_RETRY_OF])
            for t in self._study.get_trials(deepcopy=False)
            if ATTR_RETRY_OF in t.user_attrs
        }

    def finished(self) -> list[StoredTrial]:
        """Trials with an outcome (interrupted ones excluded: they are tried again)."""
        skip = self.interrupted()
        return [
            StoredTrial(t)
            for t in self._study.get_trials(deepcopy=False, states=_FINISHED)
            if t.number not in skip
        ]

    def running(self) -> list[StoredTrial]:
        """Trials left RUNNING: by a killed driver, when this driver is the only writer."""
        return [
            StoredTrial(t)
            for t in self._study.get_trials(deepcopy=False, states=(OptunaState.RUNNING,))
        ]

    def queued(self) -> int:
        """Configurations queued and not asked yet (seeds, retries)."""
        return len(self._study.get_trials(deepcopy=False, states=(OptunaState.WAITING,)))

    def exhausted(self) -> bool:
        sampler = self._study.sampler
        return isinstance(sampler, optuna.samplers.GridSampler) and sampler.is_exhausted(
            self._study
        )

    def grid_waits(self) -> bool:
        """Grid only: every point not finished yet is running. Asked now, Optuna's
        GridSampler would offer a running point again (it does once none is left unstarted),
        so the driver waits for one to finish instead."""
        sampler = self._study.sampler
        if not isinstance(sampler, _AskTellGridSampler):
            return False
        points = sampler.n_points
        started = {
            t.system_attrs.get("grid_id") for t in self._study.get_trials(deepcopy=False)
            if t.state is not OptunaState.WAITING
        }  # fmt: skip
        return all(i in started for i in range(points))

    def roles(self) -> dict[int, str]:
        """trial -> ``baseline`` / ``enqueued[i]``; a retry inherits its original's role."""
        return stored_roles(self.trials())

    def completed_by_key(self) -> dict[str, StoredTrial]:
        """The first successfully measured trial of each canonical candidate."""
        seen: dict[str, StoredTrial] = {}
        for t in self._study.get_trials(deepcopy=False, states=(OptunaState.COMPLETE,)):
            # A trial that missed the SLO was measured all the same: its result is reused.
            if t.constraints and t.constraints.get(CONSTRAINT_FAILED, 0) > 0:
                continue
            key = t.user_attrs.get(ATTR_KEY)
            if key and key not in seen:
                seen[key] = StoredTrial(t)
        return seen

    def failed_by_key(self) -> dict[str, StoredTrial]:
        """The first trial of each canonical candidate that failed as a configuration."""
        seen: dict[str, StoredTrial] = {}
        for t in self._study.get_trials(deepcopy=False, states=(OptunaState.COMPLETE,)):
            if not (t.constraints and t.constraints.get(CONSTRAINT_FAILED, 0) > 0):
                continue
            key = t.user_attrs.get(ATTR_KEY)
            if key and key not in seen and ATTR_REUSED_FROM not in t.user_attrs:
                seen[key] = StoredTrial(t)
        return seen

    # -- ask / tell ------------------------------------------------------------------------
    def ask(
        self,
        candidate: Candidate | None = None,
        *,
        reason: str = "",
        repeat_of: int | None = None,
    ) -> TrialHandle:
        """A new trial: the next queued one, or ``candidate`` (queued now), or the sampler's.

        Raises:
            ConfigError: the stored study cannot be sampled with this space.
        """
        if candidate is not None and not self.queued():
            attrs: dict[str, Any] = {ATTR_REASON: reason} if reason else {}
            if repeat_of is not None:
                attrs[ATTR_REPEAT_OF] = repeat_of
            self.enqueue(self.space.params_of(candidate), **attrs)
        trial = self._pop_baseline() or self._study.ask()
        try:
            chosen = self.space.suggest(trial)
        except ValueError as exc:  # e.g. Optuna refusing choices that differ from the stored
            self._study.tell(trial, state=OptunaState.FAIL)
            raise ConfigError(
                f"search: cannot sample study {self.cfg.study.name!r}: {exc}"
            ) from exc
        trial.set_user_attr(ATTR_KEY, canonical_key(chosen))
        trial.set_user_attr(ATTR_LABEL, chosen.label())
        return TrialHandle(trial, chosen)

    def ask_outside(
        self, candidate: Candidate, params: Mapping[str, Any], *, role: str, reason: str = ""
    ) -> TrialHandle:
        """A trial of a configuration outside the space (a plan's verification): Optuna keeps
        the trial (its number names the Parquet row, its value is told as any other's) but
        suggests nothing; ``params`` are what its row stores (the candidate's reader reads them
        back)."""
        trial = self._study.ask()
        trial.set_user_attr(ATTR_ROLE, role)
        if reason:
            trial.set_user_attr(ATTR_REASON, reason)
        trial.set_user_attr(ATTR_OUTSIDE, dict(params))
        trial.set_user_attr(ATTR_KEY, canonical_key(candidate))
        trial.set_user_attr(ATTR_LABEL, candidate.label())
        return TrialHandle(trial, candidate, params)

    def _pop_baseline(self) -> optuna.Trial | None:
        """A queued baseline (a retry of an interrupted one), ahead of the rest of the queue.

        Optuna pops queued trials oldest first, so the retry of a baseline interrupted on
        resume would run after the enqueued trials queued behind the original, and those would
        meet a correctness gate with no reference. This pops it as ``Study.ask`` pops a queued
        trial (the storage's RUNNING transition, then ``optuna.Trial``);
        ``tests/reliability_tests/test_baseline_role.py`` pins that against the installed Optuna.
        """
        waiting = self._study.get_trials(deepcopy=False, states=(OptunaState.WAITING,))
        first = next((t for t in waiting if t.user_attrs.get(ATTR_ROLE) == "baseline"), None)
        if first is None or first is waiting[0]:
            return None  # Optuna's own order already runs it first
        storage = self._study._storage
        try:
            if not storage.set_trial_state_values(first._trial_id, state=OptunaState.RUNNING):
                return None  # taken meanwhile: Optuna's order then
        except optuna.exceptions.UpdateFinishedTrialError:
            return None
        return optuna.Trial(self._study, first._trial_id)

    def tell(self, trial: TrialHandle, result: TrialResult) -> None:
        """Record ``result``: the one place an outcome becomes an Optuna state."""
        self._set_attrs(trial, result)
        violation = result.metrics.get("slo_violation")
        measured = result.state in (TrialState.COMPLETE, TrialState.PRUNED)
        if measured and violation is not None and math.isfinite(violation):
            trial._trial.set_constraint(CONSTRAINT_SLO, float(violation))
        if result.state is TrialState.COMPLETE:
            self._study.tell(trial.number, result.value, skip_if_finished=True)
        elif result.state is TrialState.PRUNED:
            self._study.tell(trial.number, state=OptunaState.PRUNED, skip_if_finished=True)
        elif result.failure in NOT_THE_CONFIG:
            self._study.tell(trial.number, state=OptunaState.FAIL, skip_if_finished=True)
        else:
            trial._trial.set_constraint(CONSTRAINT_FAILED, 1.0)
            self._study.tell(trial.number, 0.0, skip_if_finished=True)

    def tell_stored(self, result: TrialResult) -> None:
        """Tell a trial a killed driver left running from its Parquet row (recovery), as
        :meth:`tell` would have: the same state, value, attributes and constraints (``slo``,
        ``failed``), so a resumed study's sampler sees what the original's saw. A trial no
        longer running is left alone (told already)."""
        try:
            trial = self.running_trial(result.trial, result.candidate)
        except KeyError:
            return
        self.tell(trial, result)

    def running_trial(self, number: int, candidate: Candidate) -> TrialHandle:
        """A live handle on a trial a stopped driver left running (as ``_pop_baseline`` builds
        one: constraints and attributes are set through it before the tell), with
        ``candidate`` its stored row's.

        Raises:
            KeyError: no trial of that number is running.
        """
        running = self._study.get_trials(deepcopy=False, states=(OptunaState.RUNNING,))
        frozen = next((t for t in running if t.number == number), None)
        if frozen is None:
            raise KeyError(number)
        return TrialHandle(optuna.Trial(self._study, frozen._trial_id), candidate)

    @staticmethod
    def _set_attrs(trial: TrialHandle, result: TrialResult) -> None:
        trial.set_attr("state", result.state.value)
        if result.failure:
            trial.set_attr(ATTR_FAILURE, result.failure)
            trial.set_attr("failure_detail", result.failure_detail[:2000])
            trial.set_attr("log_tail", result.log_tail[-4000:])
        for key in TRIAL_METRIC_ATTRS:
            value = result.metrics.get(key)
            if value is not None and value == value:  # not NaN
                trial.set_attr(key, float(value))
        if result.launch is not None:
            trial.set_attr("engine", result.launch.engine)

    @staticmethod
    def keep_record(trial: TrialHandle, record: TrialRecord) -> None:
        """Copy into the journal what a rebuilt Parquet row needs (run values, the restart it
        counted, the launch): written before the row, which is written before ``tell``."""
        if record.run_values:
            trial.set_attr(ATTR_RUN_VALUES, [round(v, 6) for v in record.run_values])
        if record.restart is not None and record.result.launch is not None:
            trial.set_attr(ATTR_RESTART, record.restart)
        launch = record.result.launch
        if launch is not None:
            trial.set_attr(ATTR_LAUNCH, {
                "argv": list(launch.argv), "env": redact_env(dict(launch.env)),
                "unset_env": list(launch.unset_env), "engine": launch.engine,
                "log_path": launch.log_path,
            })  # fmt: skip

    def enqueue(self, params: Mapping[str, Any], **attrs: Any) -> None:
        """Queue a configuration; parameters left out mean unset (NCCL) or off (flags)."""
        complete = self.space.params_of(self.space.candidate(self.space.coerce(params)))
        attrs = {**attrs, ATTR_QUEUED: complete}
        self._study.enqueue_trial(complete, user_attrs=attrs, skip_if_exists=False)

    def seed(self) -> None:
        """Queue the baseline, then ``study.enqueue``, before anything the sampler picks.

        Idempotent and resumable: each configuration carries its role, and only the roles the
        study does not hold yet are queued, in order. A driver killed half-way through seeding
        loses none. Once the sampler has proposed a trial the study counts as seeded.
        """
        if self._study.user_attrs.get("seeded"):
            return
        trials = self._study.get_trials(deepcopy=False)
        if any(ATTR_ROLE not in t.user_attrs and ATTR_RETRY_OF not in t.user_attrs
               for t in trials):  # fmt: skip
            self._study.set_user_attr("seeded", True)  # an older study, already past seeding
            return
        have = {t.user_attrs.get(ATTR_ROLE) for t in trials}
        base = self.space.params_of(self.space.baseline())
        wanted = [("baseline", base)]
        wanted += [(f"enqueued[{i}]", p) for i, p in enumerate(self.cfg.study.enqueue)]
        if self.cfg.server.engine is Engine.sglang and self.cfg.bench.check_outputs:
            # A second start of the baseline measures the engine's own output drift, which the
            # correctness gate must not mistake for a wrong answer.
            wanted.append((ROLE_BASELINE_AGAIN, base))
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
        self._study.set_user_attr("seeded", True)

    # -- resume ----------------------------------------------------------------------------
    def requeue(self, trial: StoredTrial | TrialHandle) -> None:
        """Queue an interrupted trial's configuration again, once (idempotent).

        The retry's ``retry_of`` attribute is what marks ``trial`` as interrupted.
        """
        if trial.number in self.interrupted():
            return
        # A queued trial's whole configuration, as queued: a driver killed while the trial's
        # parameters were being set leaves only some of them, and the sampler would fill the
        # rest at random (a "baseline" retry that is not the baseline).
        params = dict(trial.attrs.get(ATTR_QUEUED) or trial.params)
        attrs: dict[str, Any] = {ATTR_RETRY_OF: trial.number, ATTR_QUEUED: params}
        for key in (ATTR_ROLE, ATTR_REASON, ATTR_REPEAT_OF):  # the retry is what it retries
            if key in trial.attrs:
                attrs[key] = trial.attrs[key]
        self._study.enqueue_trial(params, user_attrs=attrs)

    def retry_elsewhere(self, trial: TrialHandle) -> bool:
        """Queue the configuration of a trial whose node died again, once: False when
        ``trial`` is itself such a retry (its configuration is not queued a third time).

        The retry's ``retry_of`` points at ``trial``, as an interrupted trial's does, so the
        lost trial counts as retried and the retry keeps its role, reason and ``repeat_of``.
        """
        if trial.attrs.get(ATTR_NODE_RETRY):
            return False
        params = trial.params
        attrs: dict[str, Any] = {
            ATTR_RETRY_OF: trial.number, ATTR_QUEUED: params, ATTR_NODE_RETRY: trial.number,
        }  # fmt: skip
        for key in (ATTR_ROLE, ATTR_REASON, ATTR_REPEAT_OF):
            if key in trial.attrs:
                attrs[key] = trial.attrs[key]
        self._study.enqueue_trial(params, user_attrs=attrs)
        return True

    def fail(self, number: int) -> None:
        """Mark a trial FAIL (no-op when it already finished)."""
        self._study.tell(number, state=OptunaState.FAIL, skip_if_finished=True)

    def set_study_attrs(self, attrs: Mapping[str, Any]) -> None:
        """Study user attributes (what optuna-dashboard shows for the study)."""
        for key, value in attrs.items():
            self._study.set_user_attr(key, value)

    def study_attrs(self) -> dict[str, Any]:
        """The study's user attributes as stored."""
        return dict(self._study.user_attrs)


def open_study(cfg: ExperimentConfig, space: SearchSpace) -> StudyHandle:
    """Create the study, or resume it from its storage.

    A new study enqueues the baseline (no speculation, NCCL unset) first, then the
    configurations of ``study.enqueue`` in order, before anything the search picks.

    Raises:
        ConfigError: the storage holds this study from an experiment with another engine,
            search space or measurement (:mod:`rayspec.search._resume`).
    """
    sampler = _make_sampler(cfg, space)  # first: a grid too large is refused, nothing written
    storage = _make_storage(cfg.storage_url)
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
    check_same_experiment(cfg, space, study.user_attrs)
    check_stored_choices(cfg, space, study.get_trials(deepcopy=False))
    if ATTR_MEASURED_WITH not in study.user_attrs:  # a new study, or one kept without it
        study.set_user_attr(ATTR_MEASURED_WITH, measurement_fingerprint(cfg))
    handle.set_study_attrs(study_description(cfg))
    handle.seed()
    return handle


def study_description(cfg: ExperimentConfig) -> dict[str, Any]:
    """What optuna-dashboard shows for the study: the experiment, engine, versions, profile and
    budget (set on every open, so a resumed study shows its latest budget)."""
    from rayspec._version import __version__

    srv = cfg.server
    twin = srv.engine is Engine.twin
    scenarios = ", ".join(f"{sc.name} (concurrency {sc.concurrency})" for sc in cfg.scenarios())
    return {
        "experiment": cfg.study.name,
        "engine": srv.engine.value,
        "sglang_version": srv.twin.version if twin else srv.sglang_version,
        "twin_profile": srv.twin.profile if twin else "",
        "model_path": "" if twin else srv.model_path,
        "tp_size": srv.tp_size,
        "rayspec_version": __version__,
        "sampler": cfg.study.sampler.value,
        "max_restarts": cfg.study.max_restarts,
        "start_noise": cfg.study.start_noise,
        "pick_margin": cfg.study.pick_margin,
        "slo": ", ".join(f"{k} {v:g}" for k, v in cfg.study.slo.items()),
        "bench": f"{cfg.bench.warmup} warm-up, {plural(cfg.bench.repeats, 'run')} "
        f"(up to {cfg.max_repeats}); scenarios {scenarios}",
        "output_dir": os.path.abspath(cfg.out_dir),
    }
