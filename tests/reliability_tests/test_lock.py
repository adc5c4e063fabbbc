"""One driver per study: an exclusive lock on the study folder, naming its holder."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from rayspec.store import StudyFolder
from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study
from rayspec.tune._lock import StudyLockedError
from rayspec.tune._lock import study_lock
from tests.helpers import REPO
from tests.reliability_tests._support import quiet
from tests.reliability_tests._support import twin_cfg

_HOLD = (
    "import sys; from rayspec.tune._lock import study_lock\n"
    "with study_lock(sys.argv[1]):\n"
    "    print('held', flush=True); sys.stdin.readline()\n"
)


@pytest.fixture
def holder(tmp_path):
    """Another process holding the study lock until the test ends."""
    out = str(tmp_path / "eagle3-twin")
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD, out], cwd=REPO, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    yield proc
    assert proc.stdin is not None
    proc.stdin.close()
    proc.wait(timeout=30)


def test_a_second_driver_is_refused_naming_the_holder(tmp_path, holder) -> None:
    cfg = twin_cfg(str(tmp_path), "study.max_restarts=2")
    with pytest.raises(StudyLockedError) as caught:
        run_study(cfg, printer=quiet, trial_fn=SimulatedTrials())
    message = str(caught.value)
    assert f"pid {holder.pid} on host {socket.gethostname()} since " in message, message
    assert "\n" not in message and message.startswith("output.dir: study folder ")
    assert not os.path.exists(os.path.join(cfg.out_dir, "trials"))  # nothing written


def test_the_cli_refuses_a_locked_study_with_one_line_and_exit_2(tmp_path, holder, capsys) -> None:
    from rayspec.tune.__main__ import main

    cfg = twin_cfg(str(tmp_path))
    code = main([os.path.join(REPO, "experiments", "eagle3-twin.yaml"),
                 f"output.dir={tmp_path}", f"server.port={cfg.server.port}"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert f"pid {holder.pid}" in err[0] and "in use by another rayspec driver" in err[0]


def test_a_dead_drivers_lock_is_taken_over(tmp_path) -> None:
    cfg = twin_cfg(str(tmp_path), "study.max_restarts=1")
    os.makedirs(cfg.out_dir)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    with open(StudyFolder(cfg.out_dir).lock, "w") as fh:
        json.dump({"pid": int(dead.stdout), "host": "gone", "start_unix_s": 0}, fh)
    lines: list[str] = []
    outcome = run_study(cfg, printer=lines.append, trial_fn=SimulatedTrials())
    assert outcome.ran == 1
    assert (
        f"study lock: taken over from a driver that is gone (pid {int(dead.stdout)} "
        "on host gone since 1970-01-01 00:00:00 UTC)" in lines
    ), lines


def test_the_lock_is_reentrant_in_one_process_and_released_after(tmp_path) -> None:
    out = str(tmp_path / "s")
    with study_lock(out), study_lock(out):
        pass
    code = subprocess.run([sys.executable, "-c", _HOLD, out], cwd=REPO, input="\n",
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert code.returncode == 0 and code.stdout.strip() == "held", code.stderr
