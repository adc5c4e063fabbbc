"""The structured search tries each scheduler knob's values at the best configuration, only
where a value changes what runs at the study's loads."""

from __future__ import annotations

from rayspec._config import load_config
from rayspec.testing import SimulatedTrials
from rayspec.tune._driver import run_study
from tests.helpers import TWIN_EXPERIMENT

SMALL = [
    "search.nccl={}",
    "search.nccl_screen.enabled=false",
    "search.speculative.modes=[off,EAGLE3]",
    "search.speculative.num_steps=[2]",
    "search.speculative.eagle_topk=[1]",
    "bench.repeats=2",
    "bench.warmup=0",
]


def _knob_trials(tmp_path, *overrides: str) -> list:
    cfg = load_config(
        TWIN_EXPERIMENT, [f"output.dir={tmp_path}", "study.max_restarts=12", *SMALL, *overrides]
    )
    trials: list = []

    class _Recording(SimulatedTrials):
        def __call__(self, cfg, number, candidate, **kw):
            trials.append(candidate)
            return super().__call__(cfg, number, candidate, **kw)

    run_study(cfg, trial_fn=_Recording(), printer=lambda _line: None)
    return trials


def test_each_knob_value_is_tried_once_at_the_best_configuration(tmp_path) -> None:
    trials = _knob_trials(
        tmp_path,
        "server.max_running_requests=32",
        "search.scheduler.cuda_graph_max_bs=[8,32]",
        "bench.scenarios=[{name: c32, concurrency: 32, requests_per_run: 32, max_tokens: 64}]",
    )
    knobbed = [c for c in trials if c.scheduler]
    # 8 once; 32 is the server's own graph cap here (48, clamped to the running cap 32) and is
    # never launched as a second copy of the pick (a confirming start of a winner may repeat).
    assert [c.knobs["cuda_graph_max_bs"] for c in knobbed][:1] == [8]
    assert {c.knobs["cuda_graph_max_bs"] for c in knobbed} == {8}
    # At the best configuration: the knob trials keep one speculative setting, a measured one.
    assert len({c.spec for c in knobbed}) == 1
    assert {c.spec for c in knobbed} <= {c.spec for c in trials if not c.scheduler}


def test_a_value_past_every_load_is_not_launched(tmp_path) -> None:
    trials = _knob_trials(
        tmp_path,
        "server.max_running_requests=64",
        "server.cuda_graph_max_bs=null",
        "search.scheduler.max_running_requests=[16,32,64]",
        "bench.scenarios=[{name: c16, concurrency: 16, requests_per_run: 16, max_tokens: 64}]",
    )
    # At 16 streams a running cap of 16, 32 or 64 queues nothing and graphs every batch: the
    # server's 64 already measured it.
    assert [c for c in trials if c.scheduler] == []
