"""The NCCL screen's node dies (or its GPUs never come free): the study goes on without a
ranking, launching the default and enqueued NCCL sets, and saves nothing a resume would reuse
(simulated trials and a fake screen, no Ray)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from collections.abc import Sequence

from rayspec._config import load_config
from rayspec._exceptions import LaunchError
from rayspec.results import candidate_reader
from rayspec.screen import BaseNcclScreen
from rayspec.screen import ScreenResult
from rayspec.search import SearchSpace
from rayspec.store import ParquetTrialStore
from rayspec.store import StudyFolder
from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study
from tests.helpers import TWIN_EXPERIMENT


class _NodeDiesMidScreen(BaseNcclScreen):
    """Answers like RayNcclScreen when the node under its actor dies."""

    def __init__(self) -> None:
        self.calls = 0

    def measure(
        self, envs: Sequence[Mapping[str, str]], sizes_bytes: Sequence[int], *, timeout_s: float
    ) -> list[ScreenResult]:
        self.calls += 1
        raise LaunchError("the NCCL screen's actor died (its node lost?): node 10.0.0.9 died")


def test_a_screen_whose_node_dies_leaves_the_study_without_a_ranking(tmp_path) -> None:
    cfg = load_config(TWIN_EXPERIMENT, [
        f"output.dir={tmp_path}", "study.max_restarts=4", "bench.warmup=0", "bench.repeats=2",
        "bench.max_repeats=2", "bench.max_tokens=40",
    ])  # fmt: skip
    screen = _NodeDiesMidScreen()
    lines: list[str] = []
    outcome = run_study(cfg, trial_fn=SimulatedTrials(), screen=screen, printer=lines.append)
    assert screen.calls == 1 and outcome.restarts == 4
    assert any(
        line.startswith("NCCL screen: stopped (the NCCL screen's actor died") for line in lines
    )
    assert not os.path.exists(StudyFolder(cfg.out_dir).nccl_screen)  # a resume screens again
    # Without a ranking only the default and the enqueued NCCL sets are launched.
    space = SearchSpace.from_config(cfg.search)
    enqueued = space.candidate(space.coerce(cfg.study.enqueue[0])).nccl_env
    records = ParquetTrialStore(cfg.out_dir).load_records(candidate_reader(space))
    assert {r.candidate.nccl_env for r in records if r.launched} <= {(), enqueued}
