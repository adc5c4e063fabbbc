"""The commands the README and its pages (docs/, CONTRIBUTING.md, benchmarks/results/README.md)
print for reading a finished study (the report, pandas, DuckDB, the optuna CLI) run exactly as
printed, from a folder laid out like the quickstart's: ``runs/eagle3-twin`` and the venv at
``.venv``."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.helpers import REPO
from tests.report_tests.conftest import Study

_FENCE = re.compile(r"```bash\n(.*?)```", re.S)


def _pages() -> list[str]:
    """The README and the pages its sections moved to: every markdown file of docs/, the
    contributor guide and the results' page."""
    docs = sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))
    rest = ["CONTRIBUTING.md", "CHANGELOG.md", os.path.join("benchmarks", "results", "README.md")]
    return [os.path.join(REPO, "README.md"), *docs, *(os.path.join(REPO, p) for p in rest)]


def _text(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def _doc_lines() -> list[str]:
    """Each ``.venv/bin/`` line of a bash block of those pages, once, in order."""
    lines = [
        line.strip()
        for page in _pages()
        for block in _FENCE.findall(_text(page))
        for line in block.splitlines()
        if line.strip().startswith(".venv/bin/")
    ]
    return list(dict.fromkeys(lines))


def _reading_commands() -> list[str]:
    """The lines that read a finished study folder (the ones that start servers, Ray or a web
    UI are covered by the front-door tests or cannot run here)."""
    keep = []
    for line in _doc_lines():
        if "optuna-dashboard" in line or "rayspec.tune" in line or "rayspec.metrics" in line:
            continue
        if "runs/eagle3-twin" in line or line.startswith(".venv/bin/pip install -q pandas"):
            keep.append(line)
    return keep


def test_the_docs_show_the_report_pandas_duckdb_and_optuna_commands() -> None:
    cmds = _reading_commands()
    for needle in ("-m rayspec.report", "import pandas", "import duckdb", "bin/optuna trials",
                   "bin/optuna studies", "pip install -q pandas duckdb"):  # fmt: skip
        assert any(needle in c for c in cmds), (needle, cmds)


@pytest.fixture()
def quickstart_folder(study: Study, tmp_path: object) -> str:
    """A folder with ``runs/eagle3-twin`` (a copy of the simulated study: the report command
    rewrites its report.md, which the other tests read) and ``.venv`` (this venv)."""
    folder = str(tmp_path)
    shutil.copytree(study.out_dir, os.path.join(folder, "runs", "eagle3-twin"), symlinks=True)
    os.symlink(sys.prefix, os.path.join(folder, ".venv"))
    assert os.path.basename(study.out_dir) == "eagle3-twin"
    return folder


@pytest.mark.parametrize("command", _reading_commands())
def test_each_command_works_as_printed(command: str, quickstart_folder: str, study: Study) -> None:
    if not os.path.exists(os.path.join(sys.prefix, "bin", "python")):
        pytest.skip(f"the tests do not run in a venv with bin/python ({sys.prefix})")
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    done = subprocess.run(
        ["bash", "-c", command], cwd=quickstart_folder, env=env, capture_output=True,
        text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
    picked = study.outcome.report.best
    assert picked is not None
    if "pandas as pd" in command or "'runs/eagle3-twin/trials" in command:
        assert picked.label in done.stdout  # the picked configuration's rows are there
        assert "FAIL" in done.stdout  # the wrong_output trial too, with its null value
    if "rayspec.report" in command:
        assert "report.md" in done.stdout
    if "requests/" in command:
        assert "ttft_ms" in done.stdout
    if "optuna trials" in command:
        assert "candidate:" in done.stdout and "failure_reason: wrong_output" in done.stdout
    if "optuna studies" in command:
        assert "eagle3-twin" in done.stdout and "twin_profile" in done.stdout


_SESSION = "session_2026-12-01_10-00-00_000000_1"
_EXPORTED = f"""# TYPE ray_rayspec_best_tok_s gauge
ray_rayspec_best_tok_s{{SessionName="{_SESSION}",WorkerId="ab",study="eagle3-twin"}} 97.5
ray_rayspec_best_tok_s{{SessionName="{_SESSION}",WorkerId="cd",study="another-study"}} 12.0
ray_rayspec_best_tok_s{{SessionName="session_before",WorkerId="ef",study="eagle3-twin"}} 55.0
# TYPE ray_rayspec_restarts gauge
ray_rayspec_restarts{{SessionName="{_SESSION}",study="eagle3-twin"}} 4.0
"""


def test_the_metrics_command_prints_this_study_or_one_line(quickstart_folder: str) -> None:
    """The docs' live-metrics line, as printed: this study's samples of this session only;
    once the study has stopped, one line and exit 1, no traceback."""
    from rayspec.metrics import write_exporter_file
    from tests.helpers import prometheus_exporter

    (command,) = [line for line in _doc_lines() if "rayspec.metrics" in line]
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    out_dir = os.path.join(quickstart_folder, "runs", "eagle3-twin")

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", command], cwd=quickstart_folder, env=env, capture_output=True,
            text=True, timeout=60,
        )  # fmt: skip

    with prometheus_exporter(_EXPORTED) as address:
        write_exporter_file(out_dir, "eagle3-twin", address, _SESSION)
        live = run()
    assert live.returncode == 0, (command, live.stderr)
    assert live.stdout.splitlines() == [
        'ray_rayspec_best_tok_s{study="eagle3-twin"} 97.5',
        'ray_rayspec_restarts{study="eagle3-twin"} 4',
    ]
    gone = run()
    assert gone.returncode == 1 and gone.stdout == "" and "Traceback" not in gone.stderr
    assert len(gone.stderr.strip().splitlines()) == 1
    assert f"its Ray exporter {address} does not answer" in gone.stderr


def test_the_median_ttft_query_counts_measured_runs_only(
    quickstart_folder: str, study: Study
) -> None:
    """The docs' per-trial TTFT query, as printed, leaves the warm-up requests (run -1) out:
    its counts and medians are those of the measured runs."""
    import pyarrow.dataset as pads

    (command,) = [c for c in _reading_commands() if "median(ttft_ms)" in c]
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    done = subprocess.run(
        ["bash", "-c", command], cwd=quickstart_folder, env=env, capture_output=True,
        text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    shown = {
        int(m.group(1)): (int(m.group(2)), float(m.group(3)))
        for m in re.finditer(r"│\s*(\d+)\s*│\s*(\d+)\s*│\s*([\d.]+)\s*│", done.stdout)
    }
    table = pads.dataset(os.path.join(study.out_dir, "requests")).to_table().to_pylist()
    assert any(r["run"] < 0 for r in table)  # the study has warm-up rows to leave out
    expected: dict[int, tuple[int, float]] = {}
    for trial in sorted({r["trial"] for r in table}):
        ttfts = sorted(
            r["ttft_ms"]
            for r in table
            if r["trial"] == trial and r["run"] >= 0 and r["ttft_ms"] is not None
        )
        if ttfts:
            mid = len(ttfts) // 2
            median = ttfts[mid] if len(ttfts) % 2 else (ttfts[mid - 1] + ttfts[mid]) / 2
            count = sum(1 for r in table if r["trial"] == trial and r["run"] >= 0)
            expected[trial] = (count, round(median, 1))
    assert shown.keys() == expected.keys(), (shown, expected)
    for trial, (count, median) in expected.items():
        assert shown[trial][0] == count, (trial, shown[trial], count)
        assert abs(shown[trial][1] - median) <= 0.05 + 1e-9, (trial, shown[trial], median)


def test_the_column_list_names_every_column_the_commands_use() -> None:
    """The table of trial columns (docs/output.md, the study folder) names each column the
    reading commands select."""
    rows = [
        line
        for page in _pages()
        for line in _text(page).splitlines()
        if line.startswith("| `trials/trial-")
    ]
    assert len(rows) == 1, rows  # one table of the study folder
    (row,) = rows
    assert row in _text(os.path.join(REPO, "docs", "output.md"))
    listed = set(re.findall(r"`([a-z_0-9]+)`", row))
    used: set[str] = set()
    for command in _reading_commands():
        if "trials" not in command or "requests/" in command:
            continue
        used |= set(re.findall(r"'([a-z_]+)'", command.split("[[", 1)[-1].split("]]")[0]))
        select = re.search(r"select (.*?) from", command)
        if select:  # its column names: aliases and SQL functions aside
            names = re.findall(r"[a-z_]+", re.sub(r" as [a-z_]+", "", select.group(1)))
            used |= set(names) - {"round", "median", "count"}
    assert {"trial", "state", "value", "candidate"} <= used, used
    assert used <= listed, sorted(used - listed)
