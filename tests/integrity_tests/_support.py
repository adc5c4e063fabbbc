"""Shared by the integrity and chaos tests: small twin studies run in-process on the twin's
model (:class:`rayspec.testing.SimulatedTrials`, no Ray), and the invariants of a study folder."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import pyarrow.parquet as pq

from rayspec._config import ExperimentConfig
from rayspec._config import load_config
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import free_port_block

FAST = ["bench.repeats=2", "bench.max_tokens=40", "cluster.include_dashboard=false"]


def twin_cfg(out: str, *extra: str) -> ExperimentConfig:
    """The quickstart's twin experiment, small: ``study.max_restarts`` etc. in ``extra``."""
    return load_config(
        TWIN_EXPERIMENT, [f"output.dir={out}", f"server.port={free_port_block()}", *FAST, *extra]
    )


def quiet(_line: str) -> None:
    pass


def journal_trials(cfg: ExperimentConfig) -> dict[int, Any]:
    """The journal's trials (FrozenTrial by number), read as Optuna reads them."""
    import optuna
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    storage = JournalStorage(JournalFileBackend(cfg.storage_url))
    study = optuna.load_study(study_name=cfg.study.name, storage=storage)
    return {t.number: t for t in study.get_trials(deepcopy=False)}


def row_hashes(cfg: ExperimentConfig) -> dict[int, str]:
    """trial -> a hash of its trial row's measured content (what must never be overwritten)."""
    folder = os.path.join(cfg.out_dir, "trials")
    out: dict[int, str] = {}
    if not os.path.isdir(folder):
        return out
    for name in sorted(os.listdir(folder)):
        if not (name.startswith("trial-") and name.endswith(".parquet")):
            continue
        row = pq.read_table(os.path.join(folder, name)).to_pylist()[0]
        kept = (row["state"], row["value"], row["start_unix_s"], row["run_values"],
                row["candidate_key"], row["role"])  # fmt: skip
        out[int(row["trial"])] = hashlib.sha256(repr(kept).encode()).hexdigest()
    return out
