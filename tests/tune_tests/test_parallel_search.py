"""Several slots asking at once: no sampler runs one configuration twice at the same time, and
the restart budget counts launches of every slot (simulated trials, no Ray)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from rayspec._config import load_config
from rayspec._types import Candidate
from rayspec._types import TrialResult
from rayspec.testing import SlottedTrials
from rayspec.tune import run_study
from tests.helpers import TWIN_EXPERIMENT


def test_four_slots_never_run_one_configuration_twice_and_share_one_budget(tmp_path) -> None:
    cfg = load_config(TWIN_EXPERIMENT, [
        f"output.dir={tmp_path}", "study.max_restarts=20", "bench.repeats=3",
        "bench.max_tokens=100",
    ])  # fmt: skip
    trials = SlottedTrials(overlap=4)  # the overlap does not rest on this machine's speed
    outcome = run_study(cfg, trial_fn=trials, slots=4, printer=lambda _line: None)
    assert trials.peak == 4  # the slots were used at once
    assert trials.twice == []
    # One budget across the slots: never more launches than it allows, however many ran at once.
    assert outcome.restarts == trials.launched <= 20
    assert outcome.restarts == 20 or outcome.stopped.startswith("converged")


def test_the_slot_count_may_change_while_the_study_runs(tmp_path) -> None:
    """A function for ``slots`` (a cluster whose nodes come and go) is asked again: one slot,
    then three."""
    cfg = load_config(TWIN_EXPERIMENT, [
        f"output.dir={tmp_path}", "study.max_restarts=12", "bench.repeats=3",
        "bench.max_tokens=100",
    ])  # fmt: skip
    trials = SlottedTrials(overlap=3)
    asked = {"n": 0}

    def slots() -> int:
        asked["n"] += 1
        return 1 if trials.launched < 4 else 3

    outcome = run_study(cfg, trial_fn=trials, slots=slots, printer=lambda _line: None)
    assert asked["n"] > 1 and trials.peak == 3 and trials.twice == []
    assert outcome.restarts == trials.launched <= 12


def _small_space(tmp_path: Any, sampler: str) -> Any:
    """Six configurations (no speculation x three protocols x two algorithms): four slots of
    Optuna's own samplers would soon draw one that is running."""
    from rayspec._config import load_config as load
    from tests.helpers import twin_doc
    from tests.helpers import write_experiment

    doc = twin_doc(
        str(tmp_path),
        study={"sampler": sampler, "max_restarts": 12, "n_trials": 40},
        search={"nccl": {"NCCL_PROTO": ["unset", "LL", "Simple"], "NCCL_ALGO": ["unset", "Ring"]},
                "speculative": {"modes": ["off"]}},
        bench={"warmup": 0, "repeats": 1, "max_repeats": 1, "max_tokens": 20},
    )  # fmt: skip
    return load(write_experiment(str(tmp_path), doc))


@pytest.mark.parametrize("sampler", ["random", "grid"])
def test_optunas_samplers_never_run_a_configuration_that_runs_in_another_slot(
    tmp_path, sampler: str
) -> None:
    """A draw of a running configuration waits for it, holding no slot, and reuses its result;
    every trial keeps its row and none is left running."""
    from rayspec.results import candidate_reader
    from rayspec.search import SearchSpace
    from rayspec.search import open_study
    from rayspec.store import ParquetTrialStore

    cfg = _small_space(tmp_path, sampler)
    trials = SlottedTrials(overlap=4)  # the overlap does not rest on this machine's speed
    outcome = run_study(cfg, trial_fn=trials, slots=4, printer=lambda _line: None)
    assert trials.peak > 1 and trials.twice == []
    handle = open_study(cfg, SearchSpace.from_config(cfg.search))
    records = ParquetTrialStore(cfg.out_dir).load_records(candidate_reader(handle.space))
    assert sorted(r.trial for r in records) == sorted(t.number for t in handle.trials())
    assert not handle.running() and outcome.restarts == trials.launched
    # Each of the six configurations launched once at most; the rest of the draws were reuses.
    launched = [r.candidate_key for r in records if r.launched]
    assert len(launched) == len(set(launched)) <= 6
    if sampler == "grid":
        assert outcome.stopped == "every configuration of the grid was tried"


def test_the_grid_walks_a_space_of_trees_to_its_end(tmp_path) -> None:
    """Trees take a draft-token parameter named by the tree, topk 1 none: four slots of the grid
    launch each of the twelve configurations once, then the study stops as exhausted."""
    from rayspec.search import SearchSpace
    from tests.helpers import twin_doc
    from tests.helpers import write_experiment

    doc = twin_doc(
        str(tmp_path),
        study={"sampler": "grid", "max_restarts": 30, "n_trials": 60},
        search={"nccl": {"NCCL_PROTO": ["unset", "LL"]},
                "speculative": {"modes": ["off", "EAGLE3"], "num_steps": [1, 2],
                                "eagle_topk": [1, 2], "num_draft_tokens": [2, 4]}},
        bench={"warmup": 0, "repeats": 1, "max_repeats": 1, "max_tokens": 20},
    )  # fmt: skip
    cfg = load_config(write_experiment(str(tmp_path), doc))
    trials = SlottedTrials(overlap=4)  # the overlap does not rest on this machine's speed
    outcome = run_study(cfg, trial_fn=trials, slots=4, printer=lambda _line: None)
    assert outcome.stopped == "every configuration of the grid was tried"
    assert trials.twice == [] and trials.peak > 1
    # off 1, topk 1: 2, trees (1, 2) x topk 2: 1 + 1 (2 steps hold their path of 3 tokens with
    # 4 only); x {unset, LL}: each launched once
    assert outcome.restarts == trials.launched == SearchSpace.from_config(cfg.search).size() == 10


def test_held_draws_of_a_trial_that_found_no_room_are_queued_again_with_their_rows(
    tmp_path,
) -> None:
    """A space of one configuration: every draw is held on the running baseline; the baseline
    finds no room (``no_placement``), so nothing may start and nothing can be reused: each held
    trial is recorded interrupted and queued again, none is left running."""
    from rayspec._exceptions import FailureReason
    from rayspec.results import candidate_reader
    from rayspec.search import SearchSpace
    from rayspec.search import open_study
    from rayspec.store import ParquetTrialStore
    from rayspec.tune._trial import failed_result
    from tests.helpers import twin_doc
    from tests.helpers import write_experiment

    doc = twin_doc(str(tmp_path), study={"sampler": "random", "n_trials": 20},
                   search={"speculative": {"modes": ["off"]}})  # fmt: skip
    cfg = load_config(write_experiment(str(tmp_path), doc))
    started: list[int] = []

    def no_room(cfg: Any, number: int, candidate: Candidate, **kw: Any) -> TrialResult:
        started.append(number)
        time.sleep(0.3)  # the other slot draws meanwhile
        return failed_result(number, candidate, FailureReason.NO_PLACEMENT, "no room (test)")

    outcome = run_study(cfg, trial_fn=no_room, slots=2, printer=lambda _line: None)
    assert started == [0] and outcome.stopped.startswith("no room on the cluster")
    handle = open_study(cfg, SearchSpace.from_config(cfg.search))
    states = {t.number: t.attrs.get("failure_reason") for t in handle.trials()
              if t.optuna_state != "WAITING"}  # fmt: skip
    assert states[0] == "no_placement" and len(states) > 1
    assert all(v == "interrupted" for n, v in states.items() if n != 0), states
    retried = {t.attrs.get("retry_of") for t in handle.trials() if t.optuna_state == "WAITING"}
    assert set(states) <= retried and not handle.running()
    rows = ParquetTrialStore(cfg.out_dir).load_records(candidate_reader(handle.space))
    assert sorted(r.trial for r in rows) == sorted(states)  # every trial has its row


def test_a_trial_that_ends_before_the_baseline_is_still_checked_and_guards_the_pick(
    tmp_path,
) -> None:
    """With two slots the hand-tuned floor ends before the baseline, whose outputs the
    correctness gate compares it with: it is recorded once the baseline is, checked, so it is
    a floor the pick can keep (judged at once it was unchecked, never picked, and no floor)."""
    import threading

    from rayspec.results import GATE_UNCHECKED
    from rayspec.results import build_report
    from rayspec.results import candidate_reader
    from rayspec.search import SearchSpace
    from rayspec.store import ParquetTrialStore
    from rayspec.testing import SimulatedTrials

    cfg = load_config(TWIN_EXPERIMENT, [
        f"output.dir={tmp_path}", "study.max_restarts=3", "bench.repeats=2",
        "bench.max_tokens=60",
    ])  # fmt: skip
    sim = SimulatedTrials()
    floor_done = threading.Event()
    order: list[int] = []

    def trial_fn(cfg: Any, number: int, candidate: Candidate, **kw: Any) -> TrialResult:
        if number == 0:  # the baseline waits until the enqueued floor has ended
            assert floor_done.wait(timeout=60)
        result = sim(cfg, number, candidate, **kw)
        order.append(number)
        if number == 1:
            floor_done.set()
        return result

    run_study(cfg, trial_fn=trial_fn, slots=2, printer=lambda _line: None)
    assert order[:2] == [1, 0]  # the floor ended first
    space = SearchSpace.from_config(cfg.search)
    records = ParquetTrialStore(cfg.out_dir).load_records(candidate_reader(space))
    floor = next(r for r in records if r.role == "enqueued[0]")
    assert GATE_UNCHECKED not in floor.result.metrics
    assert floor.result.metrics.get("gate_compared", 0) > 0
    report = build_report(records, {r.trial: r.role for r in records if r.role})
    assert report.best is not None and report.best.trials != (0,)  # the baseline is beaten


def test_a_trial_awaiting_the_baseline_when_the_driver_stops_is_kept_and_checked_on_resume(
    tmp_path,
) -> None:
    """Two slots: the floor ends first and waits for the baseline's outputs; the driver is
    interrupted while the baseline runs. The floor's measurement was lost and it was measured
    again on resume (a restart spent twice); now its row is kept, and the resume records it
    once, checked against the baseline's retry."""
    import threading

    from rayspec.results import GATE_UNCHECKED
    from rayspec.results import candidate_reader
    from rayspec.search import SearchSpace
    from rayspec.search import open_study
    from rayspec.store import ParquetTrialStore
    from rayspec.testing import SimulatedTrials

    cfg = load_config(TWIN_EXPERIMENT, [
        f"output.dir={tmp_path}", "study.max_restarts=4", "bench.repeats=2",
        "bench.max_tokens=60",
    ])  # fmt: skip
    sim = SimulatedTrials()
    floor_done, third, stop = threading.Event(), threading.Event(), threading.Event()

    def stopped_while_the_baseline_runs(
        cfg: Any, number: int, candidate: Candidate, **kw: Any
    ) -> TrialResult:
        if number == 0:  # the baseline: the driver stops once the floor awaits it
            assert third.wait(timeout=60)  # the floor was recorded as awaiting: its slot refilled
            stop.set()
            raise KeyboardInterrupt("the user pressed Ctrl-C")
        if number >= 2:
            third.set()
            assert stop.wait(timeout=60)
        result = sim(cfg, number, candidate, **kw)
        if number == 1:
            floor_done.set()
        return result

    with pytest.raises(KeyboardInterrupt):
        run_study(cfg, trial_fn=stopped_while_the_baseline_runs, slots=2,
                  printer=lambda _line: None)  # fmt: skip
    assert floor_done.is_set()
    again = SimulatedTrials()
    lines: list[str] = []
    run_study(cfg, trial_fn=again, slots=1, printer=lines.append)
    assert 1 not in again.launches, again.launches  # not measured again
    space = SearchSpace.from_config(cfg.search)
    records = ParquetTrialStore(cfg.out_dir).load_records(candidate_reader(space))
    floors = [r for r in records if r.role == "enqueued[0]"]
    assert [r.trial for r in floors] == [1], [(r.trial, r.result.failure) for r in floors]
    floor = floors[0]
    assert floor.result.state.value == "COMPLETE" and floor.run_values
    assert GATE_UNCHECKED not in floor.result.metrics
    assert floor.result.metrics.get("gate_compared", 0) > 0  # checked against the retry
    handle = open_study(cfg, space)
    assert not handle.running() and 1 not in handle.interrupted()
    assert any("waits for the baseline's outputs" in line for line in lines), lines[:5]
    # One restart for the floor's one launch: the budget counted it once.
    assert sum(1 for r in records if r.launched) == 4
