"""A resource budget: a study of 20,000 prompt categories and 400,000 prompts stays under 1 GB.

Stored as columns of the trial row, the per-category figures took the driver to 19.7 GB and
the kernel killed it (20,000 categories over 2 trials; each trial file one 16 MB row of 60,003
columns). The study runs in a subprocess (SimulatedTrials on the twin, the report written) so
its peak RSS is its own; a watchdog ends it as soon as it passes the budget, so a regression
fails fast instead of taking the machine's memory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq

from tests.helpers import REPO
from tests.helpers import twin_doc
from tests.helpers import write_experiment

BUDGET_MB = 1024
CATEGORIES = 20_000
PROMPTS = 400_000

_DRIVER = r"""
import os, resource, sys, threading, time

BUDGET_KB = int(sys.argv[2]) * 1024

def watchdog():
    page_kb = os.sysconf("SC_PAGE_SIZE") // 1024
    while True:
        with open("/proc/self/statm") as fh:
            rss_kb = int(fh.read().split()[1]) * page_kb
        if rss_kb > BUDGET_KB:
            print(f"over budget: {rss_kb // 1024} MB", flush=True)
            os._exit(3)
        time.sleep(0.02)

threading.Thread(target=watchdog, daemon=True).start()
from rayspec._config import load_config
from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study

cfg = load_config(sys.argv[1])
run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None, write_report=True)
print("peak_mb", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, flush=True)
"""


def _prompts(path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for i in range(PROMPTS):
            cat = f"topic-{i % CATEGORIES:05d}"
            fh.write(
                json.dumps({"prompt": f"Explain item {i} of {cat} in detail.", "category": cat})
            )
            fh.write("\n")


def test_a_study_of_20000_categories_and_400000_prompts_stays_under_1_gb(tmp_path) -> None:
    prompts = str(tmp_path / "prompts.jsonl")
    _prompts(prompts)
    # 32 streams: each trial's runs reach about a hundred categories, more than the report shows
    doc = twin_doc(
        str(tmp_path / "runs"),
        study={"name": "cats", "n_trials": 2},
        bench={"prompts": prompts, "warmup": 1, "repeats": 3, "max_tokens": 8, "concurrency": 32},
        cluster={"include_dashboard": False},
    )
    exp = write_experiment(str(tmp_path), doc)
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER, exp, str(BUDGET_MB)],
        cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    peak = int(done.stdout.split("peak_mb")[-1])
    assert peak < BUDGET_MB

    out = os.path.join(str(tmp_path / "runs"), "cats")
    for name in sorted(os.listdir(os.path.join(out, "trials"))):
        schema = pq.read_schema(os.path.join(out, "trials", name))
        assert not [n for n in schema.names if n.startswith("category__")]
        rows = pq.read_table(os.path.join(out, "categories", name)).num_rows
        assert 20 < rows <= 200  # the categories this trial's requests reached, as rows
    with open(os.path.join(out, "report.md"), encoding="utf-8") as fh:
        report = fh.read()
    section = report.split("## By prompt category", 1)[1].split("\n## ", 1)[0]
    assert section.count("| topic-") == 20  # bounded: the rest in one line
    assert "more categories" in section
