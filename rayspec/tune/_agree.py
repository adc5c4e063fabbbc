"""The one check at start that the Optuna journal and the Parquet trial files agree.

Run by :func:`~rayspec.tune.run_study` under the study lock, before the study is opened (which
would queue the baseline into a journal that lost its trials) and before anything is written.
The writes of a trial go journal attributes -> Parquet row -> ``tell``, so after any crash the
journal holds every trial that has a row; what else a folder can hold is damage:

- a trial file no Parquet reader can open (truncated): set aside, then rebuilt as below;
- a finished journal trial without a trial file (deleted): its row is rebuilt from the journal
  (state, value, role, reason, run values, launch, restart), its request rows are lost;
- a row the journal does not hold (the journal deleted, replaced or cut back), or a row whose
  state or value differs from the journal's: refused, since the next trial would take that
  number and overwrite a measured row. The refusal is one line saying what to restore.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any

from rayspec._config import ExperimentConfig
from rayspec._exceptions import ConfigError
from rayspec._exceptions import FailureReason
from rayspec._exceptions import StoreError
from rayspec._types import Candidate
from rayspec._types import LaunchSpec
from rayspec._types import TrialRecord
from rayspec._types import TrialResult
from rayspec._types import TrialState
from rayspec.results import candidate_reader
from rayspec.search import SearchSpace
from rayspec.search._journal import repair_journal
from rayspec.search._space import ATTR_QUEUED
from rayspec.search._stored import ATTR_ROLE
from rayspec.search._stored import StoredTrial
from rayspec.search._stored import stored_trials
from rayspec.search._study import ATTR_LAUNCH
from rayspec.search._study import ATTR_OUTSIDE
from rayspec.search._study import ATTR_REASON
from rayspec.search._study import ATTR_REPEAT_OF
from rayspec.search._study import ATTR_RESTART
from rayspec.search._study import ATTR_RUN_VALUES
from rayspec.search._study import TRIAL_METRIC_ATTRS
from rayspec.store import ParquetTrialStore

__all__ = ["prepare_folder", "rebuilt_record"]

Printer = Callable[[str], None]
_FINISHED = ("COMPLETE", "PRUNED", "FAIL")


def _span(numbers: list[int]) -> str:
    shown = ", ".join(str(n) for n in numbers[:6])
    return shown + (f" and {len(numbers) - 6} more" if len(numbers) > 6 else "")


def prepare_folder(
    cfg: ExperimentConfig,
    store: ParquetTrialStore,
    printer: Printer,
    space: SearchSpace | None = None,
) -> None:
    """Before a driver writes (the study lock held): refuse a study folder whose journal and
    trial files disagree, then repair what can be (a torn journal tail cut off, unreadable
    files set aside, missing rows rebuilt from the journal).

    Raises:
        ConfigError: one line naming what disagrees and what to do.

    ``space``: the experiment's space when the caller has built it.
    """
    files = store.file_numbers()
    trials = stored_trials(cfg)
    journal = cfg.storage_url
    if trials is None:
        if files:
            raise ConfigError(
                f"study.storage: {journal} holds no study {cfg.study.name!r}, but "
                f"{store.trials_dir} holds {len(files)} trial file(s) of one: the journal was "
                "deleted or replaced; restore it, or move that folder away to start a new study "
                "(a new study would reuse the trial numbers and overwrite those rows)"
            )
        trials = []
    by_number = {t.number: t for t in trials}
    extra = sorted(files - set(by_number))
    if extra:
        raise ConfigError(
            f"study.storage: {journal} has no trial {_span(extra)}, which {store.trials_dir} "
            "holds: the journal lost its tail or is another study's; restore the journal that "
            "goes with those files, or move the study folder away to start a new study"
        )
    # Past the refusals (a refused driver writes nothing): repairs.
    url = cfg.storage_url
    if "://" not in url:
        inside = os.path.abspath(url).startswith(os.path.abspath(cfg.out_dir) + os.sep)
        for line in repair_journal(url, sole_writer=inside):
            printer(line)
    for line in store.set_aside_damaged():
        printer(line)
    files = store.file_numbers()
    read = candidate_reader(space or SearchSpace.from_config(cfg.search))
    rows = {r.trial: r for r in store.load_records(read)} if files else {}
    differ = []
    for number, row in sorted(rows.items()):
        t = by_number[number]
        if t.optuna_state == "RUNNING":
            continue  # a killed driver's: the recovery tells or retries it
        if t.optuna_state == "WAITING" or row.result.state is not t.state:
            differ.append(f"trial {number} is {t.state.value} in the journal, "
                          f"{row.result.state.value} in its file")  # fmt: skip
        elif t.state is TrialState.COMPLETE and not _same(t.value, row.result.value):
            differ.append(f"trial {number} has value {t.value} in the journal, "
                          f"{row.result.value} in its file")  # fmt: skip
    if differ:
        raise ConfigError(
            f"study.storage: {journal} and {store.trials_dir} disagree ({'; '.join(differ[:3])}"
            f"{'; ...' if len(differ) > 3 else ''}): they are of different runs; restore the "
            "journal that goes with those files, or move the study folder away"
        )
    retried = {int(t.attrs["retry_of"]) for t in trials if "retry_of" in t.attrs}
    for t in trials:
        if t.number in rows or t.optuna_state not in _FINISHED:
            continue
        requests = store.folder.request_file(t.number)
        kept = "kept" if os.path.exists(requests) else "lost"
        store.append_trial(rebuilt_record(t, read, interrupted=t.number in retried))
        printer(f"trial {t.number}: its trial file was missing; row rebuilt from the journal "
                f"(its request rows are {kept})")  # fmt: skip


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def rebuilt_record(
    t: StoredTrial, read: Callable[[dict[str, Any]], Candidate], *, interrupted: bool
) -> TrialRecord:
    """A finished trial's row from what the journal keeps of it (``interrupted``: a later
    trial retries it)."""
    attrs = t.attrs
    launch = None
    kept = attrs.get(ATTR_LAUNCH)
    if isinstance(kept, dict):
        launch = LaunchSpec(
            argv=tuple(str(a) for a in kept.get("argv", ())),
            env=tuple((str(k), str(v)) for k, v in dict(kept.get("env", {})).items()),
            host="", port=0, log_path=str(kept.get("log_path", "")), startup_timeout_s=0.0,
            engine=str(kept.get("engine", "")),
            unset_env=tuple(str(v) for v in kept.get("unset_env", ())),
        )  # fmt: skip
    # A trial outside the space (a plan's verification) keeps its parameters in an attribute.
    params = dict(t.attrs.get(ATTR_OUTSIDE) or t.attrs.get(ATTR_QUEUED) or t.params)
    try:
        candidate = read(params) if params else Candidate()
    except (ConfigError, StoreError):  # partial: a driver killed while it was being sampled
        candidate, params = Candidate(), {}
    state = t.state
    failure = FailureReason.INTERRUPTED.value if interrupted else attrs.get("failure_reason")
    metrics = {
        k: float(attrs[k]) for k in TRIAL_METRIC_ATTRS if isinstance(attrs.get(k), (int, float))
    }
    start = t.start_unix_s or 0.0
    result = TrialResult(
        trial=t.number, state=state,
        value=t.value if state is TrialState.COMPLETE else None,
        candidate=candidate, launch=launch, metrics=metrics, requests=(),
        start_unix_s=start, end_unix_s=t.end_unix_s or start,
        failure=None if state is not TrialState.FAIL else FailureReason(failure or "unknown"),
        failure_detail="rebuilt from the Optuna journal: the trial file was missing",
    )  # fmt: skip
    repeat, restart = attrs.get(ATTR_REPEAT_OF), attrs.get(ATTR_RESTART)
    reused = attrs.get("reused_from")
    return TrialRecord(
        result=result, params=params,
        run_values=tuple(float(v) for v in attrs.get(ATTR_RUN_VALUES, ())),
        candidate_key=str(attrs.get("candidate_key", "")),
        note=f"reused the measurement of trial {reused}" if reused is not None else "",
        role=str(attrs.get(ATTR_ROLE, "")), reason=str(attrs.get(ATTR_REASON, "")),
        repeat_of=int(repeat) if repeat is not None else None,
        # An interrupted trial's launch is not counted (its retry's is).
        restart=int(restart) if restart is not None and not interrupted else None,
    )  # fmt: skip
