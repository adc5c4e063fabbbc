"""A study with two load scenarios (written straight into the store): the per-concurrency plot."""

from __future__ import annotations

import os

from rayspec import Candidate
from rayspec import LaunchSpec
from rayspec import SpecSettings
from rayspec import TrialRecord
from rayspec import TrialResult
from rayspec._types import TrialState
from rayspec.report import write_report
from rayspec.report._load import load_study_folder
from rayspec.report._plots import scenario_values
from rayspec.results import save_space
from rayspec.search import SearchSpace
from rayspec.store import ParquetTrialStore
from tests.helpers import single_and_c8_requests

LAUNCH = LaunchSpec(
    argv=("python", "-m", "sglang.launch_server", "--port", "30000"), env=(), host="127.0.0.1",
    port=30000, log_path="/tmp/x.log", startup_timeout_s=10, engine="twin",
)  # fmt: skip


def _trial(n: int, spec: SpecSettings | None, single: list[float], c8: float) -> TrialResult:
    records = single_and_c8_requests()
    mean = sum(single) / len(single)
    return TrialResult(
        trial=n, state=TrialState.COMPLETE, value=mean, candidate=Candidate(spec=spec),
        launch=LAUNCH, requests=records, start_unix_s=1.0, end_unix_s=2.0,
        metrics={"tok_s_mean": mean, "tok_s_peak": max(single), "c8__tok_s_mean": c8,
                 "accept_length": 2.0 if spec else float("nan")},
    )  # fmt: skip


def test_two_scenarios_draw_the_best_configuration_per_concurrency(tmp_path) -> None:
    root = str(tmp_path / "two-scenarios")
    store = ParquetTrialStore(root, scenarios=["c8"])
    trials = [
        (_trial(0, None, [60.0, 61.0, 60.5], 300.0), "baseline"),
        (_trial(1, SpecSettings("EAGLE3", 3, 1, 4), [92.0, 93.0, 91.0], 380.0), ""),
        (_trial(2, SpecSettings("EAGLE3", 2, 4, 6), [90.0, 89.0, 90.5], 450.0), ""),
    ]
    space = SearchSpace(modes=("off", "EAGLE3"), num_steps=(2, 3), eagle_topk=(1, 4),
                        num_draft_tokens=(4, 6), nccl=(), flags=())  # fmt: skip
    save_space(root, space)  # what the driver leaves in a study folder
    for restart, (result, role) in enumerate(trials, 1):
        runs = tuple(r for r in (result.metrics["tok_s_peak"], result.value) if r)
        store.append_trial(TrialRecord(result, params=space.params_of(result.candidate),
                                       role=role, restart=restart, run_values=runs))  # fmt: skip
    data = load_study_folder(root)
    assert [r.candidate for r in data.records] == [result.candidate for result, _ in trials]
    per = {sc: max(values, key=lambda rv: rv[1]) for sc, _, values in scenario_values(data)}
    assert per["single"][0].trial == 1 and per["c8"][0].trial == 2 and per["c8"][1] == 450.0
    files = write_report(root)
    drawn = {p.name for p in files.drawn}
    assert "concurrency.png" in drawn and os.path.getsize(
        os.path.join(root, "plots", "concurrency.png")) > 0  # fmt: skip
    skipped = {p.name: p.skipped for p in files.plots if p.skipped}
    assert "Optuna journal" in skipped["importances.png"]
