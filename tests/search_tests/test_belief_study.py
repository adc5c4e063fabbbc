"""The belief search in whole studies (the twin's model in process, no Ray): it stops by
itself, a stopped study given more restarts spends them, and the report and the search read
one decision."""

from __future__ import annotations

from rayspec._config import load_config
from rayspec.results import build_report
from rayspec.results import candidate_reader
from rayspec.results import load_equivalence
from rayspec.search import SearchSpace
from rayspec.store import ParquetTrialStore
from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study
from tests.helpers import TWIN_EXPERIMENT


def _cfg(out: str, *more: str):
    return load_config(
        TWIN_EXPERIMENT,
        [f"output.dir={out}", "study.sampler=belief", "study.name=b", "study.max_restarts=30",
         "bench.repeats=3", *more],
    )  # fmt: skip


def test_a_stopped_study_given_more_restarts_spends_them(tmp_path) -> None:
    lines: list[str] = []
    first = run_study(_cfg(str(tmp_path)), trial_fn=SimulatedTrials(), printer=lines.append)
    assert first.stopped.startswith("converged: the most a restart is expected to buy")
    used = first.restarts
    assert used < 30
    # Run again as it was: nothing is worth a restart, so nothing is started.
    again = run_study(_cfg(str(tmp_path)), trial_fn=SimulatedTrials(), printer=lines.append)
    assert again.ran == 0 and again.stopped.startswith("converged")
    # Asked for three more restarts than its budget: they are spent, each on the start worth
    # most, and then it stops by itself again.
    more = run_study(
        _cfg(str(tmp_path), "study.max_restarts=33"),
        trial_fn=SimulatedTrials(),
        printer=lines.append,
    )
    assert more.restarts == used + 3
    assert any("the 3 added are spent where they are worth most" in line for line in lines)


def test_the_report_picks_what_the_belief_decides(tmp_path) -> None:
    cfg = _cfg(str(tmp_path))
    outcome = run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None)
    space = SearchSpace.from_config(cfg.search)
    records = ParquetTrialStore(cfg.out_dir).load_records(candidate_reader(space))
    roles = {r.trial: r.role for r in records if r.role}
    same = load_equivalence(cfg.out_dir)
    believed = build_report(records, roles, equivalent=same, belief=True)
    guarded = build_report(records, roles, equivalent=same, belief=False)
    assert outcome.report.best is not None and believed.best is not None
    assert outcome.report.best.trials == believed.best.trials
    # The table's estimates are the belief's, not the floor guard's posterior.
    assert believed.rows != guarded.rows
