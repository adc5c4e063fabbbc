"""The chaos suite's machinery: seeded cases, faults at random points, and the invariants.

A case is a small twin study (its budget, an enqueued LL128 configuration that gives wrong
output on the twin's PCIe ring, or not) and a list of faults drawn from one seed. Each fault is
applied to one driver run (in-process: :func:`rayspec.tune.run_study` with the twin's model,
:class:`rayspec.testing.SimulatedTrials`), or to the study folder between two runs; after the
faults the study is run to its end. After every run the invariants are checked
(:class:`Invariants`), and the number of checks is counted.

Faults in a run land at the k-th write (a journal append or a Parquet file), k drawn at random:
``kill`` (the driver dies before the write: a BaseException no ``except Exception`` catches),
``torn`` (it dies half-way through a journal append, leaving Optuna's lock file and half a
line, as kill -9 does), ``enospc`` (the disk fills: part of the write lands, then ENOSPC), or
in a trial: ``ctrl_c`` (KeyboardInterrupt, as Ctrl-C and rayspec's SIGTERM handler raise).
Faults between runs: a torn or garbage journal tail, a trial file truncated or deleted, the
baseline's request file deleted, a stale study lock, the journal deleted or cut back (both must
be refused with one line, nothing written; the journal is then restored so the study goes on).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

import optuna
import pyarrow.parquet as pq
import yaml
from optuna.storages.journal import JournalFileBackend

import rayspec.store._parquet as parquet_module
from rayspec._config import ExperimentConfig
from rayspec._config import load_config
from rayspec._exceptions import NOT_THE_CONFIG
from rayspec._exceptions import ConfigError
from rayspec._exceptions import StoreError
from rayspec.search import StoredTrial
from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study
from tests.helpers import TWIN_EXPERIMENT

SEED_ENV = "RAYSPEC_CHAOS_SEED"
CASES_ENV = "RAYSPEC_CHAOS_CASES"

RUN_FAULTS = ("kill", "torn", "enospc", "ctrl_c")
FOLDER_FAULTS = (
    "torn_tail", "garbage_tail", "truncate_trial", "delete_trial", "delete_baseline_requests",
    "stale_lock", "delete_journal", "cut_journal",
)  # fmt: skip
LL128 = {
    "spec.mode": "EAGLE3", "spec.num_steps": 2, "spec.eagle_topk": 1,
    "nccl.NCCL_PROTO": "LL128", "nccl.NCCL_P2P_LEVEL": "SYS",
}  # fmt: skip


def base_seed() -> int:
    return int(os.environ.get(SEED_ENV, "20261201"))


class Killed(BaseException):
    """Stands for SIGKILL of the driver: unwinds past every ``except Exception``."""


@dataclasses.dataclass
class Case:
    seed: int
    restarts: int
    ll128: bool
    sampler: str
    faults: list[tuple[str, int]]  # (kind, k: the write or trial it lands at)
    warm: bool = False  # a clean run of one restart first, so folder faults find files

    def describe(self) -> str:
        return (f"chaos case seed {self.seed} ({SEED_ENV}={self.seed} {CASES_ENV}=1 reproduces "
                f"it): {self.restarts} restarts, sampler {self.sampler}, LL128 enqueued "
                f"{self.ll128}, warm start {self.warm}, faults {self.faults}")  # fmt: skip


def draw_case(seed: int) -> Case:
    rng = random.Random(seed)
    faults = []
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(RUN_FAULTS + FOLDER_FAULTS)
        faults.append((kind, rng.randint(1, 40) if kind != "ctrl_c" else rng.randint(0, 4)))
    return Case(seed, rng.randint(3, 6), rng.random() < 0.6, rng.choice(["structured", "random"]),
                faults, warm=rng.random() < 0.5)  # fmt: skip


def case_cfg(case: Case, folder: str) -> ExperimentConfig:
    layer = os.path.join(folder, "chaos.yaml")
    doc: dict[str, Any] = {"study": {"max_restarts": case.restarts, "sampler": case.sampler}}
    if case.ll128:
        doc["search"] = {"nccl": {"NCCL_PROTO": ["unset", "LL", "Simple", "LL128"]}}
        doc["study"]["enqueue"] = [LL128]
    with open(layer, "w") as fh:
        yaml.safe_dump(doc, fh)
    return load_config(TWIN_EXPERIMENT, [
        layer, f"output.dir={folder}", "bench.repeats=2", "bench.max_tokens=40",
        "cluster.include_dashboard=false", f"study.seed={case.seed % 1000}",
    ])  # fmt: skip


# -- faults in a run -------------------------------------------------------------------------


class WriteFaults:
    """Counts the driver's writes and fails the k-th as ``kind`` says."""

    def __init__(self, kind: str, k: int) -> None:
        self.kind, self.k, self.n = kind, k, 0
        self.fired = False

    def _next(self) -> bool:
        if self.kind not in ("kill", "torn", "enospc"):
            return False
        self.n += 1
        hit = not self.fired and self.n == self.k
        self.fired = self.fired or hit
        return hit

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        real_append = JournalFileBackend.append_logs
        real_write = parquet_module._write_atomic
        faults = self

        def append_logs(backend: JournalFileBackend, logs: list[dict[str, Any]]) -> None:
            if not faults._next():
                return real_append(backend, logs)
            if faults.kind == "kill":
                raise Killed(f"killed before journal write {faults.n}")
            data = ("\n".join(json.dumps(x, separators=(",", ":")) for x in logs) + "\n").encode()
            path = backend._file_path
            if faults.kind == "torn":  # kill -9 inside the append: its lock file stays
                with contextlib.suppress(FileExistsError):
                    os.symlink(path, path + ".lock")
            with open(path, "ab") as fh:
                fh.write(data[: max(1, len(data) // 2)])
            if faults.kind == "torn":
                raise Killed(f"killed inside journal write {faults.n}")
            raise OSError(errno.ENOSPC, "No space left on device", path)

        def write_atomic(folder: str, name: str, table: Any) -> str:
            if not faults._next():
                return real_write(folder, name, table)
            if faults.kind == "enospc":
                os.makedirs(folder, exist_ok=True)
                with open(os.path.join(folder, f".{name}.tmp"), "wb") as fh:
                    fh.write(b"PAR1")  # what fitted
                raise OSError(errno.ENOSPC, "No space left on device", folder)
            raise Killed(f"killed before Parquet write {faults.n} ({name})")

        JournalFileBackend.append_logs = append_logs  # type: ignore[method-assign]
        parquet_module._write_atomic = write_atomic
        try:
            yield
        finally:
            JournalFileBackend.append_logs = real_append  # type: ignore[method-assign]
            parquet_module._write_atomic = real_write


def ctrl_c_at(trial: int) -> Callable[..., Any]:
    sim = SimulatedTrials()

    def fn(cfg: ExperimentConfig, number: int, candidate: Any, **kwargs: Any) -> Any:
        if number >= trial:
            raise KeyboardInterrupt(f"Ctrl-C while trial {number} ran")
        return sim(cfg, number, candidate, **kwargs)

    return fn


# -- faults to the folder ---------------------------------------------------------------------


def _trial_files(cfg: ExperimentConfig, folder: str = "trials") -> list[str]:
    path = os.path.join(cfg.out_dir, folder)
    if not os.path.isdir(path):
        return []
    return sorted(os.path.join(path, f) for f in os.listdir(path)
                  if f.startswith("trial-") and f.endswith(".parquet"))  # fmt: skip


def damage(kind: str, cfg: ExperimentConfig, rng: random.Random) -> str:
    """Apply a folder fault; what it did ("" when there was nothing to damage)."""
    journal = cfg.storage_url
    files = _trial_files(cfg)
    if kind in ("torn_tail", "garbage_tail") and os.path.exists(journal):
        with open(journal, "ab") as fh:
            fh.write(b'{"op_code":5,"worker_id":"x' if kind == "torn_tail" else b"\xff\x00junk\n")
        return kind
    if kind == "truncate_trial" and files:
        path = rng.choice(files)
        with open(path, "r+b") as fh:
            fh.truncate(rng.randint(0, os.path.getsize(path) - 1))
        return f"truncated {os.path.basename(path)}"
    if kind == "delete_trial" and files:
        path = rng.choice(files)
        os.remove(path)
        return f"deleted {os.path.basename(path)}"
    if kind == "delete_baseline_requests":
        path = os.path.join(cfg.out_dir, "requests", "trial-000000.parquet")
        if os.path.exists(path):
            os.remove(path)
            return "deleted the baseline's request file"
    if kind == "stale_lock" and os.path.isdir(cfg.out_dir):
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True)  # fmt: skip
        with open(os.path.join(cfg.out_dir, "study.lock"), "w") as fh:
            json.dump({"pid": int(dead.stdout), "host": "h", "start_unix_s": 0.0}, fh)
        return "a dead driver's lock file"
    return ""


# -- the invariants -------------------------------------------------------------------------


def _rows(cfg: ExperimentConfig) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for path in _trial_files(cfg):
        for row in pq.read_table(path).to_pylist():
            assert int(row["trial"]) not in out, f"trial {row['trial']} stored twice"
            out[int(row["trial"])] = row
    return out


def measured_hash(row: dict[str, Any]) -> str:
    kept = (row["state"], row["value"], row["run_values"], row["candidate_key"], row["role"],
            row["failure"])  # fmt: skip
    return hashlib.sha256(repr(kept).encode()).hexdigest()


def folder_bytes(cfg: ExperimentConfig) -> dict[str, str]:
    out = {}
    for root, _dirs, files in os.walk(cfg.out_dir):
        for f in files:
            path = os.path.join(root, f)
            if f in ("chaos.yaml", "study.lock"):
                continue
            if os.path.islink(path):  # Optuna's journal lock is a symlink
                out[path] = "-> " + os.readlink(path)
                continue
            with open(path, "rb") as fh:
                out[path] = hashlib.sha256(fh.read()).hexdigest()
    return out


class Invariants:
    """The invariants of a study folder, each check counted."""

    def __init__(self) -> None:
        self.checked = 0
        self.seen: dict[int, str] = {}  # trial -> measured hash, first seen

    def ok(self, condition: bool, what: str) -> None:
        self.checked += 1
        assert condition, what

    def after_run(self, cfg: ExperimentConfig, lines: list[str], *, final: bool) -> None:
        if not os.path.exists(cfg.storage_url):
            return
        storage = optuna.storages.JournalStorage(JournalFileBackend(cfg.storage_url))
        try:
            study = optuna.load_study(study_name=cfg.study.name, storage=storage)
        except KeyError:
            return
        trials = {t.number: t for t in study.get_trials(deepcopy=False)}
        rows = _rows(cfg)
        self.ok(set(rows) <= set(trials), f"rows {sorted(set(rows) - set(trials))} not in journal")
        for n, row in rows.items():
            if row["run_values"] and n in self.seen:
                self.ok(self.seen[n] == measured_hash(row), f"trial {n}'s measured row changed")
            if row["run_values"]:
                self.seen.setdefault(n, measured_hash(row))
        if not final:
            return
        # The study ran to its end: every journal trial finished and has its row, once.
        self.ok(sorted(rows) == sorted(trials), f"journal {sorted(trials)} vs rows {sorted(rows)}")
        retried_by: dict[int, list[int]] = {}
        for t in trials.values():
            self.ok(t.state.name in ("COMPLETE", "PRUNED", "FAIL"), f"trial {t.number} {t.state}")
            state = StoredTrial(t).state.value
            self.ok(
                rows[t.number]["state"] == state,
                f"trial {t.number}: row {rows[t.number]['state']}, journal {state}",
            )
            if "retry_of" in t.user_attrs:
                retried_by.setdefault(int(t.user_attrs["retry_of"]), []).append(t.number)
        for n, row in rows.items():
            interrupted = row["failure"] in NOT_THE_CONFIG  # each tried again, once
            self.ok(
                len(retried_by.get(n, [])) == (1 if interrupted else 0),
                f"trial {n} ({row['failure']}) retried by {retried_by.get(n)}",
            )
            for retry in retried_by.get(n, []):
                self.ok(
                    rows[retry]["role"] == row["role"],
                    f"retry {retry} of {n}: role {rows[retry]['role']!r} != {row['role']!r}",
                )
        launched = sum(1 for r in rows.values() if r["restart"] is not None
                       and r["failure"] not in NOT_THE_CONFIG)  # fmt: skip
        self.ok(launched <= cfg.study.max_restarts, f"{launched} launches > budget")
        self.ok(
            any(r["role"] == "baseline" and r["run_values"] for r in rows.values()),
            "no measured baseline",
        )
        text = "\n".join(lines)
        for n, row in rows.items():
            if row["state"] != "COMPLETE" or row["restart"] is None or row["role"] == "baseline":
                continue
            compared = row["gate_compared"] is not None
            said = f"trial {n}'s outputs were not compared" in text or bool(row["failure_detail"])
            self.ok(
                compared or (row["gate_unchecked"] == 1.0 and said),
                f"trial {n} passed the gate unchecked without a word",
            )
            if row["candidate"] and "PROTO=LL128" in row["candidate"]:
                self.ok(not compared, f"trial {n}: LL128 compared and passed")

    def pick(self, cfg: ExperimentConfig, best: Any) -> None:
        rows = _rows(cfg)
        if best is None:
            return
        self.ok("PROTO=LL128" not in best.label, f"picked a wrong-output configuration: {best}")
        self.ok(any(rows[t]["gate_compared"] is not None or rows[t]["role"] == "baseline"
                    for t in best.trials), f"picked unchecked trials {best.trials}")  # fmt: skip


@dataclasses.dataclass
class Tally:
    cases: int = 0
    runs: int = 0
    faults: int = 0
    refusals: int = 0
    invariants: int = 0


def run_case(case: Case, folder: str, tally: Tally) -> None:
    """Apply the case's faults run by run, then run the study to its end; check throughout."""
    cfg = case_cfg(case, folder)
    rng = random.Random(case.seed ^ 0x5EED)
    inv = Invariants()
    lines: list[str] = []
    if case.warm:  # the same study with a budget of one, raised after (as a user does)
        tally.runs += 1
        run_study(case_cfg(dataclasses.replace(case, restarts=1), folder), printer=lines.append,
                  trial_fn=SimulatedTrials())  # fmt: skip
        inv.after_run(cfg, lines, final=False)
    for kind, k in case.faults:
        tally.faults += 1
        if kind in FOLDER_FAULTS:
            if kind in ("delete_journal", "cut_journal"):
                _refused(kind, cfg, rng, inv, tally)
            else:
                damage(kind, cfg, rng)
            continue
        faults = WriteFaults(kind, k)
        trial_fn = ctrl_c_at(k) if kind == "ctrl_c" else SimulatedTrials()
        tally.runs += 1
        try:
            with faults.installed():
                run_study(cfg, printer=lines.append, trial_fn=trial_fn)
        except (Killed, KeyboardInterrupt):
            pass
        except (OSError, StoreError) as exc:  # the CLI's one line, exit 1
            cause = exc if isinstance(exc, OSError) else exc.__cause__
            assert kind == "enospc" and isinstance(cause, OSError), repr(exc)
            assert cause.errno == errno.ENOSPC and "\n" not in str(exc), repr(exc)
        inv.after_run(cfg, lines, final=False)
    tally.runs += 1
    outcome = run_study(cfg, printer=lines.append, trial_fn=SimulatedTrials())
    if outcome.ran == 0 and not outcome.stopped.startswith("restart budget"):
        tally.runs += 1  # a study whose last run was cut short goes on
        outcome = run_study(cfg, printer=lines.append, trial_fn=SimulatedTrials())
    inv.after_run(cfg, lines, final=True)
    inv.pick(cfg, outcome.report.best)
    try:  # and it resumes again: nothing the faults left makes the next start refuse
        again = run_study(cfg, printer=lines.append, trial_fn=SimulatedTrials())
        inv.ok(again.ran == 0, f"a finished study ran {again.ran} more trials")
    except ConfigError as exc:
        inv.ok(False, f"the finished study is refused: {exc}")
    tally.runs += 1
    tally.invariants += inv.checked
    tally.cases += 1


def _refused(kind: str, cfg: ExperimentConfig, rng: random.Random, inv: Invariants,
             tally: Tally) -> None:  # fmt: skip
    """Delete or cut back the journal: the next driver must refuse (one line, nothing
    written) when trial files exist; then the journal comes back and the study goes on."""
    journal = cfg.storage_url
    files = _trial_files(cfg)
    if not os.path.exists(journal) or not files:
        return
    saved = journal + ".chaos-saved"
    shutil.copyfile(journal, saved)
    if kind == "delete_journal":
        os.remove(journal)
    else:
        # Cut back to before the last trial with a file was created.
        last = max(int(os.path.basename(f)[6:12]) for f in files)
        with open(journal, "rb") as fh:
            records = fh.readlines()
        keep, created = [], 0
        for line in records:
            try:
                doc = json.loads(line)
            except ValueError:  # a torn or garbage tail
                doc = {}
            if doc.get("op_code") == 4:  # CREATE_TRIAL
                created += 1
                if created > last:
                    break
            keep.append(line)
        with open(journal, "wb") as fh:
            fh.writelines(keep)
    before = folder_bytes(cfg)
    tally.runs += 1
    try:
        run_study(cfg, printer=lambda _s: None, trial_fn=SimulatedTrials())
    except ConfigError as exc:
        tally.refusals += 1
        inv.ok("\n" not in str(exc) and str(exc).startswith("study.storage: "), str(exc))
    else:
        inv.ok(False, f"{kind}: the driver ran on a journal that lost trials")
    inv.ok(folder_bytes(cfg) == before, f"{kind}: the refused driver wrote to the folder")
    os.replace(saved, journal)
    del rng
