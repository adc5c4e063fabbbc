"""Counted nouns read as English wherever a study writes them: ``1 step``, ``1 server start``,
``trial 13`` (never ``1 steps``, ``1 server starts``, ``trials 13``)."""

from __future__ import annotations

import dataclasses
import os
import re

from rayspec.report._load import load_study_folder
from rayspec.report._markdown import _summary
from rayspec.results import deploy_script
from rayspec.store import ParquetTrialStore
from tests.report_tests.conftest import Study

_ONE_MANY = re.compile(
    r"(?<![\d.,])1 (steps|tokens|draft tokens|runs|trials|server starts|starts|restarts|GPUs|"
    r"plots|sets|nodes)\b"
)
_TRIALS_ONE = re.compile(r"\btrials \d+\b(?!,)")  # "trials 13" naming a single trial


def _texts(study: Study) -> dict[str, str]:
    out = {"printed": "\n".join(study.lines)}
    for name in ("report.md", "best.sh"):
        path = os.path.join(study.out_dir, name)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as fh:
                out[name] = fh.read()
    rows = ParquetTrialStore(study.out_dir).load_trials().to_pylist()
    out["reasons"] = "\n".join(str(r["reason"]) for r in rows if r.get("reason"))
    out["labels"] = "\n".join(str(r["candidate"]) for r in rows if r.get("candidate"))
    return out


def test_no_count_of_one_takes_a_plural(study: Study) -> None:
    texts = _texts(study)
    # Whether the study has a count of one (a one-step chain's reason once) depends on the
    # search's path; every count of one it does print is checked.
    for where, text in texts.items():
        bad = sorted({m.group(0) for m in _ONE_MANY.finditer(text)})
        assert not bad, f"{where}: {bad}"


def test_a_single_trial_and_a_single_start_read_as_such(study: Study) -> None:
    report = study.outcome.report
    one = next(r for r in report.rows if len(r.trials) == 1 and r.starts == 1 and r.runs)
    script = deploy_script_for(study, one)
    assert "(1 server start x " in script and " runs pooled)" in script
    # The report's pick line, with that row as the pick.
    data = load_study_folder(study.out_dir)
    data = dataclasses.replace(data, report=dataclasses.replace(report, best=one))
    pick = next(line for line in _summary(data) if line.startswith("- **pick:"))
    assert f"(one server start, trial {one.trial})" in pick
    assert not _TRIALS_ONE.search(pick), pick


def deploy_script_for(study: Study, row: object) -> str:
    from rayspec._config import load_config

    cfg = load_config(os.path.join(os.path.dirname(study.out_dir), "exp.yaml"))
    return deploy_script(cfg, row, study.outcome.report.baseline)  # type: ignore[arg-type]
