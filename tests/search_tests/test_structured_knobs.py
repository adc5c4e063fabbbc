"""The structured search tries each scheduler knob's values at the best configuration."""

from __future__ import annotations

from rayspec._config import load_config
from rayspec.testing import SimulatedTrials
from rayspec.tune._driver import run_study
from tests.helpers import TWIN_EXPERIMENT


def test_each_knob_value_is_tried_once_at_the_best_configuration(tmp_path) -> None:
    cfg = load_config(
        TWIN_EXPERIMENT,
        [
            f"output.dir={tmp_path}",
            "study.max_restarts=12",
            "search.nccl={}",
            "search.nccl_screen.enabled=false",
            "search.speculative.modes=[off,EAGLE3]",
            "search.speculative.num_steps=[2]",
            "search.speculative.eagle_topk=[1]",
            "server.max_running_requests=32",
            "search.scheduler.cuda_graph_max_bs=[8,32]",
            "bench.scenarios=[{name: c32, concurrency: 32, requests_per_run: 32, max_tokens: 64}]",
            "bench.repeats=2",
            "bench.warmup=0",
        ],
    )
    trials: list = []

    class _Recording(SimulatedTrials):
        def __call__(self, cfg, number, candidate, **kw):
            trials.append(candidate)
            return super().__call__(cfg, number, candidate, **kw)

    run_study(cfg, trial_fn=_Recording(), printer=lambda _line: None)
    graph_caps = [c.knobs.get("cuda_graph_max_bs") for c in trials if c.scheduler]
    assert sorted(set(graph_caps)) == [8, 32]
    # At the best configuration: the knob trials keep one speculative setting, a measured one.
    best_spec = {c.spec for c in trials if c.scheduler}
    assert len(best_spec) == 1
    assert best_spec <= {c.spec for c in trials if not c.scheduler}
