"""``python -m rayspec.metrics STUDY_FOLDER``: this study's metrics from its own exporter only,
one line (exit 1) when it is not running; and the driver records the exporter Ray really uses."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator

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


# -- bounds: size, total time, and only the exporter a study can have written -----------------


@contextlib.contextmanager
def _raw_exporter(handler: Callable[[socket.socket], None]) -> Iterator[str]:
    """A TCP server on 127.0.0.1 whose every connection ``handler`` answers; yields host:port."""
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                try:
                    conn.recv(4096)
                    handler(conn)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=10)
        server.close()


def test_an_answer_past_the_size_bound_is_not_read_whole(tmp_path, monkeypatch) -> None:
    import rayspec.metrics._read as reader

    monkeypatch.setattr(reader, "MAX_ANSWER_BYTES", 1 << 20)
    big = TEXT + "# padding\n" * 400_000  # 4 MB of comments
    with prometheus_exporter(big) as address:
        write_exporter_file(str(tmp_path), "mine", address, SESSION)
        with pytest.raises(MetricsUnavailable, match="larger than 1 MiB"):
            read_study_metrics(str(tmp_path))


def test_a_slow_exporter_is_cut_off_by_the_total_time(tmp_path) -> None:
    def trickle(conn: socket.socket) -> None:  # headers, then a byte every 0.2 s for 30 s
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
        for _ in range(150):
            conn.sendall(b"#")
            time.sleep(0.2)

    with _raw_exporter(trickle) as address:
        write_exporter_file(str(tmp_path), "mine", address, SESSION)
        with pytest.raises(MetricsUnavailable, match="gave no whole answer within 1 s"):
            read_study_metrics(str(tmp_path), timeout_s=1.0)


@pytest.mark.parametrize(
    "address", ["192.0.2.1:9090", "example.com:80", "127.0.0.1:80/x?y=", "http://127.0.0.1:80",
                "127.0.0.1", "127.0.0.1:99999"],
)  # fmt: skip
def test_an_exporter_a_study_cannot_have_written_is_not_asked(tmp_path, address) -> None:
    write_exporter_file(str(tmp_path), "mine", address, SESSION)
    with pytest.raises(MetricsUnavailable) as err:
        read_study_metrics(str(tmp_path))
    assert "not on this machine" in str(err.value) or "not a host:port" in str(err.value)


def test_the_answer_is_never_echoed(tmp_path) -> None:
    with prometheus_exporter("SECRET-FIRST-LINE of some other service\n") as address:
        write_exporter_file(str(tmp_path), "mine", address, SESSION)
        with pytest.raises(MetricsUnavailable) as err:
            read_study_metrics(str(tmp_path))
    assert "SECRET-FIRST-LINE" not in str(err.value) and "not Prometheus text" in str(err.value)


def test_a_linked_exporter_file_is_not_read(tmp_path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with prometheus_exporter(TEXT) as address:
        write_exporter_file(str(elsewhere), "mine", address, SESSION)
        study = tmp_path / "study"
        study.mkdir()
        os.symlink(elsewhere / EXPORTER_FILE, study / EXPORTER_FILE)
        with pytest.raises(MetricsUnavailable, match="a symbolic link"):
            read_study_metrics(str(study))
