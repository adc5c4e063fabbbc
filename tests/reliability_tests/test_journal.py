"""A torn or damaged ``optuna.journal``: handled as Optuna's reader intends, never made worse,
never a traceback."""

from __future__ import annotations

import os

import pytest

from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study
from tests.helpers import REPO
from tests.reliability_tests._support import journal_trials
from tests.reliability_tests._support import quiet
from tests.reliability_tests._support import twin_cfg

TWIN = os.path.join(REPO, "experiments", "eagle3-twin.yaml")


def _study(tmp_path, restarts: int):
    cfg = twin_cfg(str(tmp_path), f"study.max_restarts={restarts}")
    run_study(cfg, printer=quiet, trial_fn=SimulatedTrials())
    return cfg


@pytest.mark.parametrize(
    "tail", [b'{"op_code":5,"worker_id":"ab', b'{"op_code":5,"wor\n', b'\xff junk\n{"op_co']
)
def test_a_torn_last_line_is_cut_off_after_a_backup_and_the_study_resumes(tmp_path, tail) -> None:
    cfg = _study(tmp_path, 2)
    with open(cfg.storage_url, "ab") as fh:
        fh.write(tail)  # a crash mid-append: half a record, with or without its newline
    size = os.path.getsize(cfg.storage_url)
    lines: list[str] = []
    more = twin_cfg(str(tmp_path), "study.max_restarts=4")
    outcome = run_study(more, printer=lines.append, trial_fn=SimulatedTrials())
    said = [line for line in lines if line.startswith("journal: ")]
    assert len(said) == 1 and "ended in a torn record" in said[0], lines
    backups = [f for f in os.listdir(cfg.out_dir) if f.startswith("optuna.journal.torn-")]
    assert len(backups) == 1
    assert os.path.getsize(os.path.join(cfg.out_dir, backups[0])) == size
    assert outcome.restarts == 4
    trials = journal_trials(cfg)  # Optuna reads the whole journal again
    assert sorted(trials) == list(range(len(trials))) and len(trials) >= 4


@pytest.mark.parametrize("garbage", [b"\xff\xfe not json \x00\n", b"{not json}\n"])
def test_damage_in_the_middle_is_one_line_and_exit_2(tmp_path, capsys, garbage) -> None:
    from rayspec.tune.__main__ import main

    cfg = _study(tmp_path, 2)
    with open(cfg.storage_url, "rb") as fh:
        lines = fh.readlines()
    at = len(lines) // 2
    lines.insert(at, garbage)
    with open(cfg.storage_url, "wb") as fh:
        fh.writelines(lines)
    before = open(cfg.storage_url, "rb").read()
    code = main([TWIN, f"output.dir={tmp_path}", f"server.port={cfg.server.port}",
                 "bench.repeats=2", "bench.max_tokens=40"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: study.storage: {cfg.storage_url} line {at + 1} "), err
    assert "Traceback" not in err[0]
    assert open(cfg.storage_url, "rb").read() == before  # nothing written


def test_an_optuna_lock_a_killed_driver_left_is_removed_at_once(tmp_path) -> None:
    cfg = _study(tmp_path, 1)
    os.symlink(cfg.storage_url, cfg.storage_url + ".lock")  # Optuna's lock, left by kill -9
    lines: list[str] = []
    more = twin_cfg(str(tmp_path), "study.max_restarts=2")
    run_study(more, printer=lines.append, trial_fn=SimulatedTrials())
    assert any(line.startswith("journal: removed ") for line in lines), lines
    assert not os.path.lexists(cfg.storage_url + ".lock")
