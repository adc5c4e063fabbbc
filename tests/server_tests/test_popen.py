"""The one Popen owner (``rayspec/_popen.py``): a program run to its end in its own session, its
output kept, and nothing of its process group left after a timeout or a failed exit."""

from __future__ import annotations

import os
import sys

import pytest

from rayspec import LaunchError
from rayspec._popen import run_to_end

# Starts a grandchild that sleeps (its output not on our pipes), prints its pid, then behaves
# as argv[1] says: "hang" sleeps, "fail" exits 3 at once.
_PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(child.pid, flush=True)
print("to stderr", file=sys.stderr, flush=True)
if sys.argv[1] == "hang":
    time.sleep(120)
sys.exit(3)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


@pytest.mark.parametrize("how", ["hang", "fail"])
def test_nothing_of_the_group_outlives_a_timeout_or_a_failed_exit(how: str) -> None:
    done = run_to_end([sys.executable, "-c", _PARENT, how], dict(os.environ), 3.0, what="a test")
    assert done.returncode == (None if how == "hang" else 3)
    grandchild = int(done.stdout.split()[0])  # what it wrote before the kill is kept
    assert "to stderr" in done.stderr
    assert not _alive(grandchild)


def test_a_program_that_ends_well_keeps_its_output() -> None:
    code = "import os, sys; print(os.environ['RAYSPEC_T']); sys.exit(0)"
    done = run_to_end([sys.executable, "-c", code], {"RAYSPEC_T": "only this"}, 30.0, what="x")
    assert (done.returncode, done.stdout, done.stderr) == (0, "only this\n", "")


def test_a_program_that_cannot_start_is_one_launch_error() -> None:
    with pytest.raises(LaunchError, match="cannot start the worker with '/nonexistent/python'"):
        run_to_end(["/nonexistent/python"], {}, 5.0, what="the worker")
