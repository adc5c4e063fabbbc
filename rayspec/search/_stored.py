"""A stored Optuna study read back without writing: its trials, roles, user attributes and
parameter importances, as plain data.

The one read-only way to open a study's storage (the driver's start checks and the report both
use it); what is returned holds no Optuna object, so readers above this package never import
optuna. A journal whose last record is torn (a crash mid-append) is read from a copy of its
good records, as Optuna's own reader would skip the tail.

    study = read_stored_study("runs/eagle3-twin/optuna.journal", "eagle3-twin")
    study.roles()         # {0: "baseline", 1: "enqueued[0]", ...}
    study.importances     # {"spec.eagle_topk": 0.42, ...}
"""

from __future__ import annotations

import os
import tempfile
import warnings
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from typing import TypeVar

import optuna
from optuna.storages import BaseStorage
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial
from sqlalchemy.exc import SQLAlchemyError

from rayspec._config import ExperimentConfig
from rayspec._exceptions import ConfigError
from rayspec._exceptions import StoreError
from rayspec._types import TrialState
from rayspec.search._journal import check_journal
from rayspec.store import StudyFolder

__all__ = [
    "ATTR_RETRY_OF",
    "ATTR_ROLE",
    "StoredStudy",
    "StoredTrial",
    "load_stored",
    "read_stored_study",
    "stored_roles",
    "stored_trials",
]

ATTR_ROLE = "role"
ATTR_RETRY_OF = "retry_of"

_T = TypeVar("_T")


class StoredTrial:
    """A finished or running trial read back from the storage (for recovery and roles)."""

    def __init__(self, frozen: FrozenTrial) -> None:
        self.number = frozen.number
        self.params: dict[str, Any] = dict(frozen.params)
        self.attrs: dict[str, Any] = dict(frozen.user_attrs)
        self.optuna_state = frozen.state.name
        self.value = frozen.value
        self.start_unix_s = frozen.datetime_start.timestamp() if frozen.datetime_start else None
        self.end_unix_s = (
            frozen.datetime_complete.timestamp() if frozen.datetime_complete else None
        )

    @property
    def user_attrs(self) -> dict[str, Any]:
        """:attr:`attrs` under Optuna's name (what optuna-dashboard shows per trial)."""
        return self.attrs

    @property
    def state(self) -> TrialState:
        """rayspec's state (a constrained COMPLETE is a FAIL).

        The ``state`` attribute is written just before ``tell``: a driver killed between the
        two leaves it on a trial the next driver fails as interrupted, so it is read only
        where Optuna's state is COMPLETE (a configuration's failure is told as COMPLETE).
        """
        stored = self.attrs.get("state")
        if self.optuna_state == "COMPLETE" and stored in TrialState.__members__:
            return TrialState(stored)
        return TrialState(self.optuna_state) if self.optuna_state != "RUNNING" else TrialState.FAIL


def stored_roles(
    trials: Sequence[StoredTrial], known: Mapping[int, str] | None = None
) -> dict[int, str]:
    """trial -> ``baseline`` / ``enqueued[i]``; a retry inherits its original's role.

    Args:
        trials: the stored trials.
        known: roles already known (the Parquet rows'), which the journal's override.
    """
    roles = dict(known or {})
    for t in sorted(trials, key=lambda t: t.number):
        role = t.attrs.get(ATTR_ROLE)
        if role:
            roles[t.number] = str(role)
        retry = t.attrs.get(ATTR_RETRY_OF)
        if retry is not None and int(retry) in roles:
            roles[t.number] = roles[int(retry)]
    return roles


@dataclass(frozen=True)
class StoredStudy:
    """A stored study as plain data.

    Attributes:
        name: the study name.
        user_attrs: the study's user attributes (experiment, engine, versions, budget).
        trials: every trial, in trial order.
        importances: parameter -> Optuna's importance for the objective, most important
            first (None: not evaluated; ``importance_note`` says why).
        importance_note: why ``importances`` is None.
        complete: the trials Optuna holds as COMPLETE (a failed configuration is one, at
            0 tok/s), which the importances are evaluated over.
    """

    name: str
    user_attrs: dict[str, Any]
    trials: tuple[StoredTrial, ...]
    importances: dict[str, float] | None = None
    importance_note: str = ""
    complete: int = 0

    def roles(self, known: Mapping[int, str] | None = None) -> dict[int, str]:
        """:func:`stored_roles` of this study's trials."""
        return stored_roles(self.trials, known)


def _storage_exists(url: str) -> bool:
    """Whether ``url`` names storage that exists (a database server is assumed to)."""
    if "://" not in url:
        return os.path.exists(url)
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return os.path.exists(os.path.expanduser(parsed.database or ""))
    return True


def _read_only(
    url: str, name: str, use: Callable[[optuna.Study], _T], *, sole: bool = False
) -> _T | None:
    """``use`` of the stored study ``name`` in ``url`` (a journal path or an RDB URL), opened
    without writing; None when nothing of that name is stored.

    Args:
        sole: a journal holding one study of another name is read as this one (a study folder
            copied and renamed).

    Raises:
        ConfigError: the RDB storage cannot be opened, or the journal is damaged before its
            end (:func:`~rayspec.search._journal.check_journal`).
        StoreError: ``sole`` and the storage holds several studies, none of that name.
    """
    if "://" in url:
        if not _storage_exists(url):  # opening it would create it (sqlite too): nothing stored
            return None
        return _use(url, url, name, use, sole)
    if not os.path.isfile(url):
        return None
    scan = check_journal(url)
    if not scan.torn:
        return _use(url, JournalStorage(JournalFileBackend(url)), name, use, sole)
    with tempfile.TemporaryDirectory(prefix="rayspec-journal-") as tmp:
        copy = StudyFolder(tmp).journal
        with open(url, "rb") as src, open(copy, "wb") as dst:
            dst.write(src.read(scan.good_bytes))
        return _use(url, JournalStorage(JournalFileBackend(copy)), name, use, sole)


def _use(
    url: str,
    storage: BaseStorage | str,
    name: str,
    use: Callable[[optuna.Study], _T],
    sole: bool,
) -> _T | None:
    try:
        if sole:
            names = optuna.get_all_study_names(storage)
            if name not in names:
                if len(names) != 1:
                    raise StoreError(f"{url} holds studies {names}, none named {name!r}")
                name = names[0]
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:  # no study of that name in the storage yet
        return None
    except SQLAlchemyError as exc:
        from sqlalchemy.engine import make_url

        shown = make_url(str(storage)).render_as_string(hide_password=True)
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"study.storage: cannot open {shown} ({first[:200]})") from None
    return use(study)


def load_stored(cfg: ExperimentConfig) -> tuple[dict[str, Any], list[FrozenTrial]] | None:
    """The experiment's stored study: its user attributes and trials as Optuna replays them,
    read without writing (None: not stored). For this package's resume checks."""
    return _read_only(
        cfg.storage_url,
        cfg.study.name,
        lambda study: (dict(study.user_attrs), study.get_trials(deepcopy=True)),
    )


def stored_trials(cfg: ExperimentConfig) -> list[StoredTrial] | None:
    """The study's trials as stored, read without writing (None: no such study stored)."""
    stored = load_stored(cfg)
    return None if stored is None else [StoredTrial(t) for t in stored[1]]


def _importances(study: optuna.Study, complete: int) -> tuple[dict[str, float] | None, str]:
    if complete < 2:
        return None, f"{complete} completed trial(s): importances need 2"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "some regimes have less than 2 trials"
            found = optuna.importance.get_param_importances(study)
    except (ValueError, RuntimeError, ZeroDivisionError) as exc:
        return None, f"Optuna could not evaluate them: {exc}"
    return {str(k): float(v) for k, v in found.items()}, ""


def read_stored_study(storage: str, name: str, *, importances: bool = False) -> StoredStudy | None:
    """The study ``name`` in ``storage`` (a journal path or an RDB URL), read without writing;
    a journal holding one study of another name is read as this one. None: nothing stored.

    Args:
        importances: evaluate the parameter importances too (Optuna's default evaluator over
            the completed trials).

    Raises:
        ConfigError: the storage cannot be opened, or the journal is damaged before its end.
        StoreError: the storage holds several studies, none named ``name``.
    """

    def snapshot(study: optuna.Study) -> StoredStudy:
        trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
        complete = sum(1 for t in trials if t.state is optuna.trial.TrialState.COMPLETE)
        values, note = _importances(study, complete) if importances else (None, "not asked")
        return StoredStudy(
            name=study.study_name, user_attrs=dict(study.user_attrs),
            trials=tuple(StoredTrial(t) for t in trials), importances=values,
            importance_note=note, complete=complete,
        )  # fmt: skip

    return _read_only(storage, name, snapshot, sole=True)
