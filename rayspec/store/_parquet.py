"""Parquet trial store: one small file per trial, written atomically.

Layout under the study folder ``<out>``::

    <out>/trials/trial-000012.parquet      one row per trial
    <out>/requests/trial-000012.parquet    one row per request of that trial

Every trial file is written with the study's whole schema (:func:`trial_schema`; a metric a
trial lacks is a null), and every request file with :data:`REQUEST_SCHEMA`, so readers that take
the first file's schema (``pq.read_table(dir)``, DuckDB's ``'trials/*.parquet'``) see every
column. This store's own reader still inspects every file (``promote_options="permissive"``), so
folders written before the schema was fixed read whole too.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from collections.abc import Collection
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from rayspec._atomic import write_atomic
from rayspec._exceptions import StoreError
from rayspec._secrets import redact_env
from rayspec._types import DEFAULT_CATEGORY
from rayspec._types import Candidate
from rayspec._types import LaunchSpec
from rayspec._types import RequestRecord
from rayspec._types import TrialRecord
from rayspec._types import TrialResult
from rayspec._types import TrialState
from rayspec.store._base import BaseTrialStore
from rayspec.store._categories import category_table
from rayspec.store._categories import is_category_column
from rayspec.store._categories import read_categories
from rayspec.store._categories import split_categories
from rayspec.store._categories import wide_rows
from rayspec.store._folder import StudyFolder

__all__ = [
    "ParquetTrialStore",
    "REQUEST_SCHEMA",
    "SUMMARY_METRICS",
    "TRIAL_METRICS",
    "TRIAL_SCHEMA",
    "record_of_row",
    "request_record",
    "trial_schema",
]

_log = logging.getLogger(__name__)
_warned: set[str] = set()  # undeclared metrics already warned about

# search.scheduler's knobs (rayspec._schema.SCHEDULER_KNOBS: the store sits below the config)
_KNOBS = ("max_running_requests", "cuda_graph_max_bs", "chunked_prefill_size")
TRIAL_SCHEMA = pa.schema(
    [
        ("trial", pa.int64()),
        ("state", pa.string()),
        ("value", pa.float64()),
        ("failure", pa.string()),
        ("failure_detail", pa.string()),
        ("candidate", pa.string()),
        ("candidate_key", pa.string()),
        ("params", pa.string()),  # JSON of the Optuna parameters
        ("env", pa.string()),  # JSON of the variables set for the server (secrets redacted)
        ("unset_env", pa.string()),  # JSON list of the variables removed
        ("command", pa.string()),  # JSON argv
        ("engine", pa.string()),
        ("node", pa.string()),
        ("spec_algorithm", pa.string()),
        ("spec_num_steps", pa.float64()),
        ("spec_eagle_topk", pa.float64()),
        ("spec_num_draft_tokens", pa.float64()),
        ("spec_adaptive", pa.bool_()),  # adaptive steps (num_steps is where they start)
        ("spec_overlap", pa.bool_()),  # False: the speculative overlap scheduler turned off
        # search.scheduler's knobs as the candidate set them; null: the server's value
        ("sched_max_running_requests", pa.float64()),
        ("sched_cuda_graph_max_bs", pa.float64()),
        ("sched_chunked_prefill_size", pa.float64()),
        ("start_unix_s", pa.float64()),
        ("end_unix_s", pa.float64()),
        ("duration_s", pa.float64()),
        ("log_path", pa.string()),
        ("log_tail", pa.string()),
        ("server_info", pa.string()),
        ("note", pa.string()),
        ("role", pa.string()),  # baseline, enqueued[i], or empty (chosen by the search)
        ("reason", pa.string()),  # why the search chose it
        ("repeat_of", pa.float64()),  # a deliberate new start of that trial's configuration
        ("restart", pa.float64()),  # the study's server launch count at this trial
        ("alarm", pa.string()),  # the acceptance alarm's hint, when it fired
        ("run_values", pa.string()),  # JSON per-run objective values (comparisons, resume)
        ("rayspec_version", pa.string()),
        # verify steps by drafts accepted, over the trial's measured requests (derived from
        # them: bench.accept_histogram; null without speculation or without requests)
        ("accept_histogram", pa.list_(pa.int64())),
    ]
)
"""Fixed columns; the float64 metric columns of :func:`trial_schema` follow them."""

# bench.summarize's keys: the objective scenario's unprefixed, each further scenario's as
# ``<scenario>__<key>``.
SUMMARY_METRICS: tuple[str, ...] = (
    "tok_s_mean", "tok_s_std", "tok_s_cv", "tok_s_min", "tok_s_max", "tok_s_peak",
    "tok_s_ci95_low", "tok_s_ci95_high", "accept_length",
    *(f"{m}_{s}" for m in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")
      for s in ("p50", "p90", "p99", "mean")),
    "requests_ok", "requests_failed", "runs", "output_tokens",
)  # fmt: skip

# bench/_slo.py's keys, per scenario as SUMMARY_METRICS are (the SLO's only with study.slo;
# the per-user decode rate always).
SLO_SUMMARY_METRICS: tuple[str, ...] = (
    "goodput", "slo_met_frac", "slo_ttft_p99_ms", "slo_itl_p99_ms", "slo_violation",
    "user_tok_s_mean",
)  # fmt: skip

TRIAL_METRICS: tuple[str, ...] = (
    *SUMMARY_METRICS,
    *SLO_SUMMARY_METRICS,
    # the server's own view (tune/_trial.py)
    "server_accept_length", "server_gen_throughput", "metrics_spec_accept_length",
    "metrics_gen_throughput", "log_accept_len_mean", "log_gen_throughput_mean",
    # the benchmark itself
    "bench_s", "bench_s_saved", "client_cpu_frac_max", "client_bound_runs",
    # against the baseline and the incumbent (tune/_decide.py comparison_metrics)
    *(f"{who}_{s}" for who in ("vs_baseline", "vs_incumbent")
      for s in ("ratio", "ci95_low", "ci95_high", "p", "significant")),
    "incumbent_trial",
    # the correctness gate
    "gate_compared", "gate_diverged_early", "gate_unchecked",
)  # fmt: skip
"""Every metric a trial row may carry (float64; absent = null). A metric not declared here is
still stored, with a warning, but readers that take one file's schema (``pq.read_table(dir)``,
DuckDB) miss it where the first file lacks it: declare new metrics here."""


def trial_schema(scenarios: Sequence[str] = ()) -> pa.Schema:
    """The one schema of every trial file of a study, so any reader sees every column.

    Per-category figures are not columns: they are rows of ``categories/`` (see
    :mod:`rayspec.store._categories`), however many categories the prompt set has.

    Args:
        scenarios: the scenarios after the first (the objective's), whose summary metrics are
            stored as ``<scenario>__<metric>``.
    """
    fields = list(TRIAL_SCHEMA) + [pa.field(m, pa.float64()) for m in TRIAL_METRICS]
    fields += [pa.field(f"{sc}__{m}", pa.float64()) for sc in scenarios for m in SUMMARY_METRICS]
    fields += [
        pa.field(f"{sc}__{m}", pa.float64()) for sc in scenarios for m in SLO_SUMMARY_METRICS
    ]
    return pa.schema(fields)


REQUEST_SCHEMA = pa.schema(
    [
        ("trial", pa.int64()),
        ("scenario", pa.string()),
        ("run", pa.int64()),
        ("index", pa.int64()),
        ("concurrency", pa.int64()),
        ("prompt_tokens", pa.float64()),
        ("completion_tokens", pa.float64()),
        ("ttft_ms", pa.float64()),
        ("e2e_ms", pa.float64()),
        ("tpot_ms", pa.float64()),
        ("output_tok_s", pa.float64()),
        ("itl_ms", pa.list_(pa.float64())),
        ("spec_verify_ct", pa.float64()),
        ("accept_length", pa.float64()),
        ("start_unix_s", pa.float64()),
        ("failure", pa.string()),  # a FailureReason value (null: the request succeeded)
        ("error", pa.string()),  # the failure's message
        ("output_ids", pa.list_(pa.int64())),  # the greedy output, for the correctness gate
        ("accept_histogram", pa.list_(pa.int64())),  # verify steps by drafts accepted
        ("category", pa.string()),  # the prompt's category (null: written before the column)
        ("sim_start_s", pa.float64()),  # arrival on the twin's simulated clock (null: wall)
        # to the first chunk with text, as outside clients time TTFT (null: no text came,
        # simulated, or written before the column); ttft_ms is to the first token
        ("ttft_text_ms", pa.float64()),
    ]
)


def _write_atomic(folder: str, name: str, table: pa.Table) -> str:
    """Write ``table`` as ``folder/name`` (a subfolder of the study: never through a link)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    final = os.path.join(folder, name)
    return write_atomic(final, sink.getvalue().to_pybytes(), root=os.path.dirname(folder))


def _read_folder(
    folder: str, schema: pa.Schema, leave_out: Callable[[str], bool] | None = None
) -> pa.Table:
    """Every trial file's rows under one schema (``leave_out``: columns not read).

    Only the ``trial-NNNNNN.parquet`` names are read: anything else in the folder (a stray
    ``notes.txt``, a leftover ``trial-000001.parquet.tmp``) is not a row of the study."""
    paths = [os.path.join(os.path.abspath(folder), StudyFolder.trial_name(n)) for n in
             sorted(_numbers(folder))]  # fmt: skip
    if not paths:
        return schema.empty_table()
    if leave_out is None:
        factory = ds.FileSystemDatasetFactory(
            pafs.LocalFileSystem(), paths, ds.ParquetFileFormat(), ds.FileSystemFactoryOptions()
        )
        unified = factory.inspect(promote_options="permissive")  # looks at every file
        return factory.finish(unified).to_table()
    # One file at a time, its footer read once: a trial file of 60,003 columns (per-category
    # columns, as written before categories/) has a 16 MB footer, and a dataset over several
    # such files held them all (745 MB for two).
    tables = []
    for path in paths:
        with pq.ParquetFile(path) as pf:
            names = [n for n in pf.schema_arrow.names if not leave_out(n)]
            tables.append(pf.read(columns=names))
    return pa.concat_tables(tables, promote_options="permissive")


def _numbers(folder: str) -> set[int]:
    """Trial numbers of the ``trial-NNNNNN.parquet`` files in ``folder``."""
    if not os.path.isdir(folder):
        return set()
    numbers = (StudyFolder.trial_number(name) for name in os.listdir(folder))
    return {n for n in numbers if n is not None}


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _ints(values: Sequence[int] | None) -> list[int] | None:
    return None if values is None else [int(v) for v in values]


def request_rows(trial: int, records: tuple[RequestRecord, ...]) -> pa.Table:
    rows = [
        {
            "trial": trial,
            "scenario": r.scenario,
            "run": r.run,
            "index": r.index,
            "concurrency": r.concurrency,
            "prompt_tokens": float(r.prompt_tokens),
            "completion_tokens": float(r.completion_tokens),
            "ttft_ms": float(r.ttft_ms),
            "e2e_ms": float(r.e2e_ms),
            "tpot_ms": float(r.tpot_ms),
            "output_tok_s": float(r.output_tok_s),
            "itl_ms": [float(x) for x in r.itl_ms],
            "spec_verify_ct": _float(r.spec_verify_ct),
            "accept_length": _float(r.accept_length),
            "start_unix_s": float(r.start_unix_s),
            "failure": r.failure.value if r.failure is not None else None,
            "error": r.error,
            "output_ids": list(r.output_ids) if r.output_ids is not None else None,
            "accept_histogram": _ints(r.accept_histogram),
            "category": r.category,
            "sim_start_s": _float(r.sim_start_s),
            "ttft_text_ms": _float(r.ttft_text_ms),
        }
        for r in records
    ]
    return pa.Table.from_pylist(rows, schema=REQUEST_SCHEMA)


def request_record(row: Mapping[str, Any]) -> RequestRecord:
    """A stored request row as the record it was written from (the inverse of
    :func:`request_rows`; a row written before the ``failure`` column reads as unknown, one
    before the ``category`` column as the default category)."""
    ids = row.get("output_ids")
    hist = row.get("accept_histogram")
    verify = row.get("spec_verify_ct")
    return RequestRecord(
        scenario=str(row["scenario"]), run=int(row["run"]), index=int(row["index"]),
        concurrency=int(row["concurrency"]), prompt_tokens=int(row["prompt_tokens"] or 0),
        completion_tokens=int(row["completion_tokens"] or 0),
        ttft_ms=_nan_if_none(row.get("ttft_ms")), e2e_ms=_nan_if_none(row.get("e2e_ms")),
        itl_ms=tuple(float(x) for x in row.get("itl_ms") or ()),
        start_unix_s=_nan_if_none(row.get("start_unix_s")),
        spec_verify_ct=int(verify) if verify is not None else None,
        accept_length=_float(row.get("accept_length")), error=row.get("error"),
        output_ids=tuple(int(i) for i in ids) if ids is not None else None,
        failure=row.get("failure"),
        accept_histogram=tuple(int(n) for n in hist) if hist is not None else None,
        category=str(row.get("category") or DEFAULT_CATEGORY),
        sim_start_s=_float(row.get("sim_start_s")),
        ttft_text_ms=_float(row.get("ttft_text_ms")),
    )  # fmt: skip


def _nan_if_none(value: Any) -> float:
    return float(value) if value is not None else float("nan")


def trial_row(record: TrialRecord | TrialResult, scenarios: Sequence[str] = ()) -> pa.Table:
    """One trial's row in :func:`trial_schema` (absent metrics are nulls; per-category figures
    are left out: :func:`~rayspec.store._categories.split_categories` takes them to their own
    rows)."""
    from rayspec._version import __version__

    if isinstance(record, TrialResult):
        record = TrialRecord(record)
    result = record.result
    launch = result.launch
    spec = result.candidate.spec
    knobs = result.candidate.knobs
    row: dict[str, Any] = {
        "trial": result.trial,
        "state": result.state.value,
        "value": _float(result.value),
        "failure": result.failure,
        "failure_detail": result.failure_detail or None,
        "candidate": result.candidate.label(),
        "candidate_key": record.candidate_key or None,
        "params": json.dumps(dict(record.params), sort_keys=True) if record.params else None,
        # a secret's value is never written (rayspec._secrets): the row says it was set
        "env": json.dumps(redact_env(dict(launch.env) if launch else dict(result.candidate.env))),
        "unset_env": json.dumps(list(launch.unset_env)) if launch else None,
        "command": json.dumps(list(launch.argv)) if launch else None,
        "engine": launch.engine if launch else None,
        "node": result.node or None,
        "spec_algorithm": spec.algorithm if spec else None,
        "spec_num_steps": _float(spec.num_steps) if spec else None,
        "spec_eagle_topk": _float(spec.eagle_topk) if spec else None,
        "spec_num_draft_tokens": _float(spec.num_draft_tokens) if spec else None,
        "spec_adaptive": spec.adaptive if spec else None,
        "spec_overlap": spec.overlap if spec else None,
        **{f"sched_{k}": _float(knobs[k]) if k in knobs else None for k in _KNOBS},
        "start_unix_s": float(result.start_unix_s),
        "end_unix_s": float(result.end_unix_s),
        "duration_s": float(result.end_unix_s - result.start_unix_s),
        "log_path": launch.log_path if launch else None,
        "log_tail": result.log_tail or None,
        "server_info": result.server_info or None,
        "note": record.note or None,
        "role": record.role or None,
        "reason": record.reason or None,
        "repeat_of": _float(record.repeat_of),
        "restart": _float(record.restart) if launch is not None else None,
        "alarm": record.alarm or None,
        "run_values": json.dumps([round(v, 6) for v in record.run_values])
        if record.run_values
        else None,
        "rayspec_version": __version__,
        "accept_histogram": _ints(record.histogram),
    }
    schema = trial_schema(scenarios)
    declared = set(schema.names)
    fields = list(schema)
    metrics, _ = split_categories(result.metrics)
    for key in sorted(metrics):
        if key in row:
            raise StoreError(f"metric {key!r} collides with a fixed trial column")
        row[key] = _float(metrics[key])
        if key not in declared:
            if key not in _warned:
                _warned.add(key)
                _log.warning(
                    "trial metric %r is not declared in rayspec/store/_parquet.py "
                    "TRIAL_METRICS: stored, but readers of one file's schema may miss it",
                    key,
                )
            fields.append(pa.field(key, pa.float64()))
    return pa.Table.from_pylist([row], schema=pa.schema(fields))


def _json(text: Any, default: Any) -> Any:
    return json.loads(text) if text else default


def record_of_row(
    row: Mapping[str, Any], candidate: Callable[[Mapping[str, Any]], Candidate]
) -> TrialRecord:
    """A stored trial row as the record it was written from (the inverse of :func:`trial_row`).

    Args:
        row: one trial row (``load_trials().to_pylist()``).
        candidate: builds the candidate from the row's Optuna parameters: the study's
            ``SearchSpace.candidate``, the one reader of parameters.
    """
    params: dict[str, Any] = _json(row.get("params"), {})
    launch = None
    if row.get("command"):
        env = _json(row.get("env"), {})
        launch = LaunchSpec(
            argv=tuple(_json(row["command"], [])), env=tuple((k, str(v)) for k, v in env.items()),
            host="", port=0, log_path=str(row.get("log_path") or ""), startup_timeout_s=0.0,
            engine=str(row.get("engine") or ""), unset_env=tuple(_json(row.get("unset_env"), [])),
        )  # fmt: skip
    metrics = {
        k: float(v) for k, v in row.items()
        if k not in _FIXED and v is not None and isinstance(v, (int, float))
    }  # fmt: skip
    result = TrialResult(
        trial=int(row["trial"]), state=TrialState(row["state"]), value=_float(row.get("value")),
        candidate=candidate(params), launch=launch, metrics=metrics, requests=(),
        start_unix_s=float(row["start_unix_s"]), end_unix_s=float(row["end_unix_s"]),
        failure=row.get("failure"), failure_detail=str(row.get("failure_detail") or ""),
        log_tail=str(row.get("log_tail") or ""), server_info=str(row.get("server_info") or ""),
        node=str(row.get("node") or ""),
    )  # fmt: skip
    repeat_of, restart = row.get("repeat_of"), row.get("restart")
    hist = row.get("accept_histogram")
    return TrialRecord(
        result=result, params=params,
        run_values=tuple(float(v) for v in _json(row.get("run_values"), [])),
        candidate_key=str(row.get("candidate_key") or ""), note=str(row.get("note") or ""),
        role=str(row.get("role") or ""), reason=str(row.get("reason") or ""),
        repeat_of=int(repeat_of) if repeat_of is not None else None,
        restart=int(restart) if restart is not None else None,
        alarm=str(row.get("alarm") or ""),
        accept_histogram=tuple(int(n) for n in hist) if hist is not None else None,
    )  # fmt: skip


_FIXED = frozenset(TRIAL_SCHEMA.names)


class ParquetTrialStore(BaseTrialStore):
    """Trials and requests as Parquet files under one study folder.

    Example::

        store = ParquetTrialStore("runs/eagle3-twin")
        store.append_trial(result)
        store.load_trials().to_pylist()
    """

    def __init__(self, root: str, scenarios: Sequence[str] = ()) -> None:
        """Args: root: the study folder; scenarios: the scenarios after the objective's (their
        ``<scenario>__<metric>`` columns are in every row, see :func:`trial_schema`)."""
        self.root = root
        self.folder = StudyFolder(root)
        self.scenarios = tuple(scenarios)
        self.trials_dir = self.folder.trials
        self.requests_dir = self.folder.requests
        self.categories_dir = self.folder.categories

    def append_trial(self, record: TrialRecord | TrialResult) -> str:
        """Write one trial's row (and its request rows).

        Raises:
            StoreError: the files cannot be written, or the trial's file already holds another
                attempt's row (a measured row is never overwritten).
        """
        result = record.result if isinstance(record, TrialRecord) else record
        name = StudyFolder.trial_name(result.trial)
        self._refuse_overwrite(result, self.folder.trial_file(result.trial))
        try:
            # Requests first: a trial row never points at request rows that do not exist.
            if result.requests:
                _write_atomic(self.requests_dir, name, request_rows(result.trial, result.requests))
            _, by_cat = split_categories(result.metrics)
            if by_cat:
                _write_atomic(self.categories_dir, name, category_table(result.trial, by_cat))
            row = trial_row(record, self.scenarios)
            return _write_atomic(self.trials_dir, name, row)
        except (OSError, pa.ArrowException) as exc:
            raise StoreError(
                f"cannot write trial {result.trial} under {self.root}: {exc}"
            ) from exc

    def _refuse_overwrite(self, result: TrialResult, path: str) -> None:
        """A trial's file is written once per attempt; rewriting the same attempt's row (same
        trial, same start) is allowed, another attempt's never is."""
        if not os.path.exists(path):
            return
        try:
            old = pq.read_table(path, columns=["start_unix_s", "state", "run_values"]).to_pylist()
        except (OSError, pa.ArrowException):
            return  # unreadable: the study's start check sets such a file aside first
        if old and old[0]["start_unix_s"] == float(result.start_unix_s):
            return
        what = "measured runs" if old and old[0]["run_values"] else "another attempt's row"
        raise StoreError(
            f"refusing to overwrite {path}: it holds {what} of trial {result.trial} "
            f"({old[0]['state'] if old else 'empty'}); the journal and the trial files disagree "
            "(restore the journal that goes with them, or move the study folder away)"
        )

    def file_numbers(self) -> set[int]:
        """The trial numbers that have a trial file (read from the names, not the rows)."""
        return _numbers(self.trials_dir)

    def set_aside_damaged(self) -> list[str]:
        """Move trial and request files no Parquet reader can open out of the readers' way
        (renamed ``.damaged-<name>``, kept for inspection); one line for each."""
        said = []
        for folder in (self.trials_dir, self.requests_dir, self.categories_dir):
            for number in sorted(_numbers(folder)):
                path = os.path.join(folder, StudyFolder.trial_name(number))
                try:
                    pq.ParquetFile(path).close()
                except (OSError, pa.ArrowException) as exc:
                    aside = os.path.join(folder, StudyFolder.damaged_name(number))
                    os.replace(path, aside)
                    said.append(
                        f"store: {path} cannot be read ({type(exc).__name__}: "
                        f"{str(exc)[:120]}); moved it to {aside}"
                    )
        return said

    def load_trials(self) -> pa.Table:
        """Every trial row (per-category columns of a file written before ``categories/`` are
        left out: :meth:`category_rows` reads them)."""
        try:
            return _read_folder(self.trials_dir, trial_schema(self.scenarios), is_category_column)
        except (OSError, pa.ArrowException) as exc:
            raise StoreError(f"cannot read {self.trials_dir}: {exc}") from exc

    def category_rows(self, trials: Collection[int] | None = None) -> list[dict[str, Any]]:
        """The per-category figures, one dict per (trial, category) (``trial``, ``category``,
        ``requests``, ``tok_s``, ``accept_length``), of ``trials`` only when given.

        A trial file written with per-category columns (before ``categories/``) is read as
        the same rows.

        Raises:
            StoreError: the files cannot be read.
        """
        try:
            rows = read_categories(self.categories_dir, trials)
            long = _numbers(self.categories_dir)
            for number in sorted(_numbers(self.trials_dir) - long):
                if trials is None or number in trials:
                    rows += wide_rows(self.folder.trial_file(number))
        except (OSError, pa.ArrowException) as exc:
            raise StoreError(
                f"cannot read the per-category figures under {self.root}: {exc}"
            ) from exc
        return sorted(rows, key=lambda r: (int(r["trial"]), str(r["category"])))

    def load_records(
        self, candidate: Callable[[Mapping[str, Any]], Candidate]
    ) -> list[TrialRecord]:
        """Every trial as the record it was written from, in trial order.

        Args:
            candidate: the study's ``SearchSpace.candidate`` (see :func:`record_of_row`).

        Raises:
            StoreError: the rows cannot be read.
        """
        return [record_of_row(r, candidate) for r in self.trial_rows()]

    def trial_rows(self) -> list[dict[str, Any]]:
        """Every trial row as a dict of its columns, in trial order (what users read).

        Raises:
            StoreError: the rows cannot be read.
        """
        return sorted(self.load_trials().to_pylist(), key=lambda r: int(r["trial"]))

    def load_requests(self) -> pa.Table:
        try:
            return _read_folder(self.requests_dir, REQUEST_SCHEMA)
        except (OSError, pa.ArrowException) as exc:
            raise StoreError(f"cannot read {self.requests_dir}: {exc}") from exc

    def scenario_concurrency(self) -> dict[str, int]:
        """scenario -> the concurrency its requests ran at, from the request rows (empty when
        there are none or they cannot be read: the report then draws no per-load plot)."""
        if not os.path.isdir(self.requests_dir):
            return {}
        try:
            files = [self.folder.request_file(n) for n in sorted(_numbers(self.requests_dir))]
            if not files:
                return {}
            table = ds.dataset(files, format="parquet").to_table(
                columns=["scenario", "concurrency"]
            )
        except (OSError, pa.ArrowException):
            return {}
        out: dict[str, int] = {}
        scenarios = table.column("scenario").to_pylist()
        for sc, c in zip(scenarios, table.column("concurrency").to_pylist(), strict=True):
            if sc is not None and c is not None:
                out.setdefault(str(sc), int(c))
        return out
