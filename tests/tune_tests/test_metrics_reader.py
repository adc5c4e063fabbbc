"""``python -m rayspec.metrics STUDY_FOLDER``: this study's metrics from its own exporter only,
one line (exit 1) when it is not running; and the driver records the exporter Ray really uses."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from rayspec._types import Candidate
from rayspec._types import TrialResult
from rayspec._types import TrialState
from rayspec.metrics import EXPORTER_FILE
from rayspec.metrics import MetricsUnavailable
from rayspec.metrics import read_study_metrics
from rayspec.metrics import write_exporter_file
from rayspec.tune._metrics import StudyMetrics
from rayspec.tune._metrics import record_exporter
from tests.helpers import REPO
from tests.helpers import prometheus_exporter

SESSION = "session_2026-12-01_10-00-00_000000_1"
TEXT = f"""# HELP ray_rayspec_best_tok_s The best measured trial's output tok/s so far.
# TYPE ray_rayspec_best_tok_s gauge
ray_rayspec_best_tok_s{{Component="core_worker",SessionName="{SESSION}",study="mine"}} 97.5
ray_rayspec_best_tok_s{{Component="core_worker",SessionName="{SESSION}",study="other"}} 12.0
ray_rayspec_best_tok_s{{Component="core_worker",SessionName="session_old",study="mine"}} 55.0
# HELP ray_rayspec_trials_total Finished trials by state.
# TYPE ray_rayspec_trials_total counter
ray_rayspec_trials_total{{SessionName="{SESSION}",state="COMPLETE",study="mine"}} 3.0
# HELP ray_node_cpu_count CPUs
# TYPE ray_node_cpu_count gauge
ray_node_cpu_count{{SessionName="{SESSION}"}} 2.0
"""


def _cli(folder: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rayspec.metrics", folder],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip


def test_prints_this_study_of_this_session_only(tmp_path) -> None:
    with prometheus_exporter(TEXT) as address:
        write_exporter_file(str(tmp_path), "mine", address, SESSION)
        done = _cli(str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        'ray_rayspec_best_tok_s{study="mine"} 97.5',
        'ray_rayspec_trials_total{state="COMPLETE",study="mine"} 3',
    ]


def test_a_study_that_is_not_running_says_so_in_one_line(tmp_path) -> None:
    with prometheus_exporter(TEXT) as address:
        pass  # stopped: nothing answers there now
    write_exporter_file(str(tmp_path), "mine", address, SESSION)
    done = _cli(str(tmp_path))
    assert done.returncode == 1 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"study mine: its Ray exporter {address} does not answer" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_folder_without_the_file_says_so_in_one_line(tmp_path) -> None:
    done = _cli(str(tmp_path))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == (
        f"rayspec.metrics: {tmp_path}: no {EXPORTER_FILE} (a study folder whose study has not "
        "started Ray)"
    )


def test_an_exporter_without_the_study_yet(tmp_path) -> None:
    with prometheus_exporter(TEXT) as address:
        write_exporter_file(str(tmp_path), "not-yet", address, SESSION)
        with pytest.raises(MetricsUnavailable, match="no metrics at .* yet"):
            read_study_metrics(str(tmp_path))


def test_the_driver_records_the_exporter_its_metrics_reach(ray_cluster, tmp_path) -> None:
    """Against the session's real Ray: the recorded exporter serves this study's samples
    (Ray exports every ~10 s, so this waits for them, up to a minute)."""
    study = f"reader-{os.getpid()}"
    path = record_exporter(str(tmp_path), study)
    assert path == os.path.join(tmp_path, EXPORTER_FILE)
    metrics = StudyMetrics(study, budget=5)
    metrics.trial_done(
        TrialResult(trial=0, state=TrialState.COMPLETE, value=42.0, candidate=Candidate(),
                    launch=None, metrics={"tok_s_mean": 42.0}, requests=(), start_unix_s=1.0,
                    end_unix_s=2.0),
        restarts=1,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    lines: list[str] = []
    while time.monotonic() < deadline:
        try:
            lines = read_study_metrics(str(tmp_path))
        except MetricsUnavailable:
            time.sleep(1)
            continue
        if any(line.startswith("ray_rayspec_best_tok_s") for line in lines):
            break
        time.sleep(1)
    assert f'ray_rayspec_best_tok_s{{study="{study}"}} 42' in lines, lines
    assert f'ray_rayspec_trial_tok_s{{study="{study}",trial="0"}} 42' in lines, lines
