from __future__ import annotations

import dataclasses
import time

from rayspec import Candidate
from rayspec import TrialResult
from rayspec._config import load_config
from rayspec.search import SearchSpace
from rayspec.search import open_study
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import cached_config


def _cfg(tmp_path, *extra: str):
    return cached_config(TWIN_EXPERIMENT, extra, out=tmp_path)


def _result(number: int, cand: Candidate, value: float, state: str = "COMPLETE") -> TrialResult:
    now = time.time()
    return TrialResult(
        trial=number, state=state, value=value if state == "COMPLETE" else None,
        candidate=cand, launch=None, metrics={"tok_s_mean": value}, requests=(),
        start_unix_s=now, end_unix_s=now, failure=None if state == "COMPLETE" else "unknown",
    )  # fmt: skip


def test_baseline_then_field_config_first(tmp_path) -> None:
    cfg = _cfg(tmp_path)
    space = SearchSpace.from_config(cfg.search)
    handle = open_study(cfg, space)
    t0 = handle.ask()
    c0 = t0.candidate
    assert c0 == space.baseline() and t0.role == "baseline"
    handle.tell(t0, _result(t0.number, c0, 60.0))
    t1 = handle.ask()
    c1 = t1.candidate
    assert t1.role == "enqueued[0]"
    assert c1.spec is not None
    assert (c1.spec.num_steps, c1.spec.eagle_topk, c1.spec.num_draft_tokens) == (2, 1, 3)
    assert c1.env == {
        "NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS",
        "NCCL_MAX_NCHANNELS": "16", "NCCL_BUFFSIZE": "16777216", "NCCL_NTHREADS": "512",
    }  # fmt: skip
    handle.tell(t1, _result(t1.number, c1, 90.0))
    assert handle.completed_by_key()[t1.attrs["candidate_key"]].number == t1.number


def test_resume_counts_and_interrupted_trials(tmp_path) -> None:
    cfg = _cfg(tmp_path)
    space = SearchSpace.from_config(cfg.search)
    handle = open_study(cfg, space)
    for i in range(3):
        trial = handle.ask()
        cand = trial.candidate
        handle.tell(trial, _result(trial.number, cand, 50.0 + i, "COMPLETE" if i else "FAIL"))
    running = handle.ask()  # the driver "dies" here
    cand = running.candidate
    params = dict(running.params)

    again = open_study(cfg, space)  # a new driver on the same storage
    assert len(again.finished()) == 3
    stale = again.running()
    assert [t.number for t in stale] == [running.number]
    for t in stale:
        again.requeue(t)
        again.requeue(t)  # idempotent: one retry
        again.fail(t.number)
    states = {t.number: t.optuna_state for t in again.trials()}
    assert states[running.number] == "FAIL"
    assert again.interrupted() == {running.number}
    assert len(again.finished()) == 3  # the interrupted one does not count
    retry = again.ask()
    assert retry.params == params and retry.candidate == cand  # tried again
    assert retry.retry_of == running.number


def test_engine_mismatch_is_refused(tmp_path) -> None:
    import pytest

    from rayspec import ConfigError

    cfg = _cfg(tmp_path)
    open_study(cfg, SearchSpace.from_config(cfg.search))
    real = cached_config(
        TWIN_EXPERIMENT,
        ["server.engine=sglang", "server.model_path=m", "server.draft_model_path=d"],
        out=tmp_path,
    )
    with pytest.raises(ConfigError, match="was run with engine twin"):
        open_study(real, SearchSpace.from_config(real.search))


def test_grid_sampler_exhausts(tmp_path) -> None:
    from tests.helpers import twin_doc
    from tests.helpers import write_experiment

    doc = twin_doc(
        str(tmp_path),
        study={"sampler": "grid"},
        search={"nccl": {"NCCL_PROTO": ["LL"]}, "speculative": {"modes": ["off"]}},
    )
    cfg = load_config(write_experiment(str(tmp_path), doc))
    space = SearchSpace.from_config(cfg.search)
    handle = open_study(cfg, space)
    seen = set()
    while not handle.exhausted():
        trial = handle.ask()
        seen.add(trial.candidate)
        handle.tell(trial, _result(trial.number, trial.candidate, 1.0))
    assert len(seen) == 2  # off x {unset, LL}


def test_grid_sampler_walks_a_tree_space_once_per_configuration(tmp_path) -> None:
    """Trees name their draft-token parameter by the tree (``...upto3``), topk 1 has none and
    takes ``spec.overlap``: the grid's points are the space's configurations, each asked once,
    with the parameters the space's own suggest path uses."""
    from tests.helpers import twin_doc
    from tests.helpers import write_experiment

    doc = twin_doc(
        str(tmp_path),
        study={"sampler": "grid", "seed": 3},
        search={"nccl": {"NCCL_PROTO": ["LL"]},
                "speculative": {"modes": ["off", "EAGLE3", "EAGLE3-adaptive"],
                                "num_steps": [1, 2, 3], "eagle_topk": [1, 2],
                                "num_draft_tokens": [2, 4, 8], "overlap": ["on", "off"]}},
    )  # fmt: skip
    cfg = load_config(write_experiment(str(tmp_path), doc))
    space = SearchSpace.from_config(cfg.search)
    handle = open_study(cfg, space)
    drawn: list[Candidate] = []
    names: set[str] = set()
    while not handle.exhausted():
        assert not handle.grid_waits()
        trial = handle.ask()
        if not trial.role:  # not the queued baseline
            drawn.append(trial.candidate)
            names.update(trial.params)
            assert trial.params == space.params_of(trial.candidate)
        handle.tell(trial, _result(trial.number, trial.candidate, 1.0))
    # off 1, adaptive x overlap 2, topk 1: 3 steps x overlap 6, trees 1 + 1 + 2 (a budget
    # within the tree's nodes and at least its accepted path, steps + 1); x {unset, LL}
    assert len(drawn) == len(set(drawn)) == space.size() == 26
    assert all(c.spec is None or c.spec.fits_tree for c in drawn)
    assert {"spec.num_draft_tokens.upto3", "spec.num_draft_tokens.from3.upto7",
            "spec.num_draft_tokens.from4", "spec.overlap"} <= names  # fmt: skip


def test_a_grid_without_conditional_parameters_is_optunas_own(tmp_path) -> None:
    """Same points, same shuffled grid ids as Optuna's product grid (a study begun with it
    resumes); this also pins the GridSampler internals the point grid sets."""
    import optuna

    from rayspec.search._study import _AskTellGridSampler

    cfg = _cfg(tmp_path, "search.speculative.modes=[off]")
    space = SearchSpace.from_config(cfg.search)
    ours = _AskTellGridSampler(space.grid_points(), seed=5)
    theirs = optuna.samplers.GridSampler(space.grid(), seed=5)
    assert ours._all_grids == theirs._all_grids
    assert ours._search_space == theirs._search_space
    assert ours._param_names == theirs._param_names
    assert ours.n_points == theirs._n_min_trials == space.size() == 729


def test_a_grid_too_large_to_walk_is_refused(tmp_path) -> None:
    import pytest

    from rayspec import ConfigError

    sizes = ",".join(str(2**i) for i in range(10, 30))
    cfg = _cfg(tmp_path, "study.sampler=grid", f"search.nccl.NCCL_BUFFSIZE=[{sizes}]")
    with pytest.raises(ConfigError, match=r"^study\.sampler: grid would try [\d,]+ config"):
        open_study(cfg, SearchSpace.from_config(cfg.search))
    assert not (tmp_path / cfg.study.name).exists()


def test_an_impossible_tree_queued_on_purpose_is_kept(tmp_path) -> None:
    from tests.helpers import twin_doc
    from tests.helpers import write_experiment

    doc = twin_doc(
        str(tmp_path),
        study={"enqueue": [{"spec.mode": "EAGLE3", "spec.num_steps": 1, "spec.eagle_topk": 2,
                            "spec.num_draft_tokens": 8}]},
    )  # fmt: skip
    cfg = load_config(write_experiment(str(tmp_path), doc))
    handle = open_study(cfg, SearchSpace.from_config(cfg.search))
    t0 = handle.ask()
    handle.tell(t0, _result(t0.number, t0.candidate, 60.0))
    cand = handle.ask().candidate
    assert cand.spec is not None and cand.spec.num_draft_tokens == 8
    assert not cand.spec.fits_tree  # recorded as infeasible by the driver, not replaced


def test_a_changed_space_is_refused_before_anything_starts(tmp_path) -> None:
    import pytest

    from rayspec import ConfigError
    from rayspec.search._resume import check_resumable

    cfg = _cfg(tmp_path)
    open_study(cfg, SearchSpace.from_config(cfg.search))
    check_resumable(cfg, SearchSpace.from_config(cfg.search))  # the same space: fine
    changed = _cfg(tmp_path, "search.nccl.NCCL_PROTO=[unset,LL]")
    with pytest.raises(ConfigError, match=r"other choices for nccl\.NCCL_PROTO"):
        check_resumable(changed, SearchSpace.from_config(changed.search))
    with pytest.raises(ConfigError, match="Optuna cannot resume a changed space"):
        open_study(changed, SearchSpace.from_config(changed.search))


def test_a_failed_configuration_teaches_the_sampler(tmp_path) -> None:
    """A launch failure is told as an infeasible COMPLETE (TPE reads constraints); an
    interrupted trial stays Optuna's FAIL (it says nothing about the configuration)."""
    import optuna

    cfg = _cfg(tmp_path)
    handle = open_study(cfg, SearchSpace.from_config(cfg.search))
    t0 = handle.ask()
    failed = _result(t0.number, t0.candidate, 0.0, "FAIL")
    handle.tell(t0, failed)
    study = optuna.load_study(study_name=cfg.study.name, storage=handle._study._storage)
    frozen = study.trials[t0.number]
    assert frozen.state is optuna.trial.TrialState.COMPLETE
    assert frozen.constraints == {"failed": 1.0}
    assert frozen.user_attrs["state"] == "FAIL" and frozen.user_attrs["failure_reason"]
    assert t0.attrs["candidate_key"] in handle.failed_by_key()
    assert t0.attrs["candidate_key"] not in handle.completed_by_key()
    [stored] = [t for t in handle.trials() if t.number == t0.number]
    assert stored.state.value == "FAIL"
    t1 = handle.ask()
    handle.tell(
        t1,
        dataclasses.replace(_result(t1.number, t1.candidate, 0.0, "FAIL"), failure="interrupted"),
    )
    assert study.trials[t1.number].state is optuna.trial.TrialState.FAIL


def test_a_proposal_is_queued_and_asked_with_its_reason(tmp_path) -> None:
    from rayspec import SpecSettings

    cfg = _cfg(tmp_path, "study.enqueue=[]")
    handle = open_study(cfg, SearchSpace.from_config(cfg.search))
    base = handle.ask()
    handle.tell(base, _result(base.number, base.candidate, 60.0))
    want = Candidate(nccl_env=(("NCCL_PROTO", "LL"),), spec=SpecSettings("EAGLE3", 2, 4, 6))
    trial = handle.ask(want, reason="tree ladder", repeat_of=None)
    assert trial.candidate == want and trial.reason == "tree ladder" and trial.role == ""
    handle.tell(trial, _result(trial.number, want, 99.0))
    again = handle.ask(want, reason="confirm", repeat_of=trial.number)
    assert again.repeat_of == trial.number and again.candidate == want
