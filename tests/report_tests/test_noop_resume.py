"""A resume with nothing left to run still writes best.sh and report.md from one source: the
launch line in report.md is best.sh's, whatever changed in the experiment (here server.port)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.helpers import REPO
from tests.helpers import free_port
from tests.report_tests.conftest import simulated_study


def test_a_noop_resume_with_another_port_rewrites_best_sh_and_report_alike(tmp_path) -> None:
    made = simulated_study(str(tmp_path), max_restarts=4, write_report=True)
    port = free_port()
    done = subprocess.run(
        [sys.executable, "-m", "rayspec.tune", os.path.join(tmp_path, "exp.yaml"),
         f"server.port={port}"],
        cwd=REPO, capture_output=True, text=True, timeout=240,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "nothing left to run" in done.stdout
    with open(os.path.join(made.out_dir, "best.sh"), encoding="utf-8") as fh:
        best_sh = fh.read()
    with open(os.path.join(made.out_dir, "report.md"), encoding="utf-8") as fh:
        report = fh.read()
    assert f"--port {port}" in best_sh
    block = re.search(r"## Best launch command\n\nFrom [^\n]*:\n\n```bash\n(.*?)```", report, re.S)
    assert block is not None, report[:2000]
    assert block.group(1) == best_sh
