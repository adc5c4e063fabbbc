"""The study loop's one seam to a search: any :class:`rayspec.search.Strategy` runs a study
(no Ray, simulated twin starts, seconds)."""

from __future__ import annotations

from rayspec._config import load_config
from rayspec.search import SearchSpace
from rayspec.search import Strategy
from rayspec.search import Wait
from rayspec.search import canonical_key
from rayspec.store import ParquetTrialStore
from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study
from tests.helpers import twin_doc
from tests.helpers import write_experiment


class _Listed(Strategy):
    """Proposes the given configurations in order, then says it is done."""

    def __init__(self, candidates) -> None:
        self.todo = list(candidates)
        self.asked: list[int] = []  # observations seen at each ask

    def ask(self, study, observations, running):
        self.asked.append(len(observations))
        if not self.todo:
            return Wait(done="the list is done")
        return study.ask(self.todo.pop(0), reason="from the list")


def _cfg(tmp_path):
    doc = twin_doc(
        str(tmp_path),
        study={"sampler": "random", "max_restarts": 10},
        search={"nccl": {"NCCL_PROTO": ["LL"]},
                "speculative": {"modes": ["off", "EAGLE3"], "num_steps": [1, 2, 3],
                                "eagle_topk": [1]}},
        bench={"warmup": 0, "repeats": 2, "max_tokens": 50},
    )  # fmt: skip
    doc["study"].pop("n_trials")
    return load_config(write_experiment(str(tmp_path), doc))


def test_a_strategy_of_its_own_runs_the_study_through_the_seam(tmp_path) -> None:
    """The loop asks the strategy only once the queue (the baseline) is empty, records what it
    proposes with its reason, and stops with the strategy's own reason."""
    cfg = _cfg(tmp_path)
    space = SearchSpace.from_config(cfg.search)
    baseline = canonical_key(space.baseline())
    wanted = [c for c in map(space.candidate, space.grid_points())
              if canonical_key(c) != baseline][:3]  # fmt: skip
    strategy = _Listed(wanted)
    outcome = run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None,
                        strategy=strategy)  # fmt: skip
    rows = sorted(ParquetTrialStore(cfg.out_dir).load_trials().to_pylist(),
                  key=lambda r: r["trial"])  # fmt: skip
    assert rows[0]["role"] == "baseline"
    chosen = rows[1:]
    assert [r["reason"] for r in chosen] == ["from the list"] * 3
    assert [r["candidate_key"] for r in chosen] == [canonical_key(c) for c in wanted]
    assert outcome.stopped == "the list is done"
    assert strategy.asked == [1, 2, 3, 4]  # one slot: each ask sees every trial before it
