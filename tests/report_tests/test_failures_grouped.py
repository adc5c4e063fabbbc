"""A broken study (every launch fails alike) reports its failures grouped: one line for the
trials that failed with the same reason and message, and one table row per configuration that
failed alike, not one per trial."""

from __future__ import annotations

import re
from typing import Any

from rayspec._config import load_config
from rayspec._exceptions import FailureReason
from rayspec.report._load import load_study_folder
from rayspec.report._markdown import render
from rayspec.report._markdown import table_rows
from rayspec.server import build_launch
from rayspec.tune import run_study
from rayspec.tune._trial import failed_result
from tests.helpers import twin_doc
from tests.helpers import write_experiment

# A crash mid-benchmark: the same startup failure twice in a row would stop the study
# (tune/_halt.py) before 30 trials; one mid-benchmark is the configuration's, so it goes on.
WHY = "ImportError: libcudart.so.12: cannot open shared object file <no such file> | see log"


def _broken(cfg: Any, number: int, candidate: Any, **_: Any) -> Any:
    launch = build_launch(cfg, candidate, port=cfg.server.port, log_path="-", trial=number)
    return failed_result(number, candidate, FailureReason.CRASH_MID_BENCHMARK, WHY, launch=launch)


def _numbers(span: str) -> list[int]:
    out: list[int] = []
    for part in span.split(", "):
        a, _, b = part.partition("-")
        out += range(int(a), int(b or a) + 1)
    return out


def test_a_broken_study_reports_one_line_per_kind_of_failure(tmp_path) -> None:
    doc = twin_doc(
        str(tmp_path / "runs"),
        study={"name": "broken", "n_trials": 30, "sampler": "random", "max_restarts": 40},
    )
    cfg = load_config(write_experiment(str(tmp_path), doc))
    run_study(cfg, trial_fn=_broken, printer=lambda _l: None)
    data = load_study_folder(cfg.out_dir)
    assert len(data.rows) == 30 and all(r["state"] == "FAIL" for r in data.rows)
    text = render(data, [], str(tmp_path))
    section = text.split("## Failures", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("- ")]
    assert 1 < len(lines) <= 5  # one per kind of failure, not one per trial (30 before)
    why = "cannot open shared object file &lt;no such file&gt; \\| see log"  # escaped
    (launched,) = [line for line in lines if line.endswith(why)]
    # Runs of trials as spans ("- trials 0-3, 5, 11, ..."): which trials launch is the random
    # sampler's (the space's draws), that they are grouped is the report's.
    assert re.match(
        r"- trials \d+-\d+(, \d+(-\d+)?)+ \(\d+ alike\) \(crash_mid_benchmark\): ", launched
    ), launched
    spans = [line.split(" (", 1)[0].split(" ", 2)[2] for line in lines]  # "- trials 3, 5-7"
    named = [n for span in spans for n in _numbers(span)]
    assert sorted(named) == list(range(30))  # every failed trial in one line exactly
    entries = table_rows(data)
    assert sorted(t for e in entries for t in e["trials"]) == list(range(30))
    assert len(entries) == len({(e["config"], tuple(e["flags"])) for e in entries}) < 30
