"""SGLang's newer speculative modes in the space, the command builder and the search."""

from __future__ import annotations

import pytest

from rayspec import Candidate
from rayspec import SpecSettings
from rayspec._config import load_config
from rayspec._exceptions import ConfigError
from rayspec.search import SearchSpace
from rayspec.server import build_launch
from rayspec.store import ParquetTrialStore
from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study
from tests.helpers import TWIN_EXPERIMENT

MODES = [
    "search.speculative.modes=[off,EAGLE3,EAGLE3-adaptive]",
    "search.speculative.overlap=[on,off]",
]


def _cfg(tmp_path, *extra: str):
    return load_config(TWIN_EXPERIMENT, [f"output.dir={tmp_path}", *extra])


def test_adaptive_is_one_point_and_overlap_a_chain_parameter(tmp_path) -> None:
    space = SearchSpace.from_config(_cfg(tmp_path, *MODES).search)
    adaptive = space.candidate({"spec.mode": "EAGLE3-adaptive"})
    assert adaptive.spec == SpecSettings("EAGLE3", 3, 1, 4, adaptive=True)
    chain_off = space.candidate(
        {"spec.mode": "EAGLE3", "spec.num_steps": 2, "spec.eagle_topk": 1, "spec.overlap": "off"}
    )
    assert chain_off.spec == SpecSettings("EAGLE3", 2, 1, 3, overlap=False)
    assert chain_off.label().startswith("EAGLE3 2 steps, topk 1, 3 draft tokens, overlap off")
    tree = space.candidate({"spec.mode": "EAGLE3", "spec.num_steps": 2, "spec.eagle_topk": 4,
                            "spec.num_draft_tokens": 6})  # fmt: skip
    assert tree.spec is not None and tree.spec.overlap
    for cand in (adaptive, chain_off, tree):
        assert space.candidate(space.params_of(cand)) == cand
    assert "spec.overlap" not in space.params_of(tree)
    plain = SearchSpace.from_config(_cfg(tmp_path).search)
    # Every chain counts twice (overlap on/off), adaptive twice; nothing else changes.
    chains = len(plain.num_steps)
    nccl = plain.size() // _spec_points(plain)
    assert space.size() == plain.size() + (chains + 2) * nccl


def _spec_points(space: SearchSpace) -> int:
    bare = SearchSpace(space.modes, space.num_steps, space.eagle_topk, space.num_draft_tokens,
                       nccl=(), flags=())  # fmt: skip
    return bare.size()


def test_the_launch_lines_of_the_modes(tmp_path) -> None:
    cfg = _cfg(tmp_path, *MODES)
    adaptive = Candidate(spec=SpecSettings("EAGLE3", 3, 1, 4, adaptive=True))
    argv = build_launch(cfg, adaptive, port=1, log_path="-").argv
    assert "--speculative-adaptive" in argv and "--disable-overlap-schedule" not in argv
    off = Candidate(spec=SpecSettings("EAGLE3", 2, 1, 3, overlap=False))
    launch = build_launch(cfg, off, port=1, log_path="-")
    assert "--disable-overlap-schedule" in launch.argv
    assert "SGLANG_ENABLE_SPEC_V2" not in launch.env_dict
    # Before 0.5.18 the overlap scheduler is an environment variable.
    old = _cfg(tmp_path, *MODES[1:], "server.twin.version=0.5.12")
    launch = build_launch(old, off, port=1, log_path="-")
    assert "--disable-overlap-schedule" not in launch.argv
    assert launch.env_dict["SGLANG_ENABLE_SPEC_V2"] == "False"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["search.speculative.modes=[off,EAGLE3-adaptive]", "server.twin.version=0.5.21"],
         "search.speculative.modes: EAGLE3-adaptive needs SGLang 0.5.23 or later"),
        (["search.speculative.overlap=[maybe]"],
         "search.speculative.overlap: 'maybe' is not one of on, off"),
        (["search.speculative.overlap=[on,off]", "server.twin.version=0.4.10"],
         "search.speculative.overlap: off needs SGLang 0.5.5 or later"),
        (["search.speculative.modes=[off,EAGLE3-fast]"],
         "search.speculative.modes: 'EAGLE3-fast' is not one of off, EAGLE3, EAGLE,"),
    ],
)  # fmt: skip
def test_modes_the_version_lacks_are_refused(tmp_path, overrides, message) -> None:
    with pytest.raises(ConfigError) as info:
        _cfg(tmp_path, *overrides)
    assert str(info.value).startswith(message)


def test_the_search_asks_each_new_mode_once_after_the_ladders(tmp_path) -> None:
    cfg = _cfg(tmp_path, *MODES, "study.max_restarts=14", "bench.warmup=1", "bench.repeats=5",
               "bench.max_tokens=500")  # fmt: skip
    run_study(cfg, trial_fn=SimulatedTrials(), printer=lambda _line: None)
    rows = sorted(ParquetTrialStore(cfg.out_dir).load_trials().to_pylist(),
                  key=lambda r: r["trial"])  # fmt: skip
    reasons = [r["reason"] or "" for r in rows]
    adaptive = [r for r in rows if r["spec_adaptive"]]
    assert len(adaptive) == 1 and "adaptive steps" in adaptive[0]["reason"]
    assert "--speculative-adaptive" in adaptive[0]["command"]
    off = [r for r in rows if r["spec_overlap"] is False]
    assert off and "with overlap off" in off[0]["reason"]
    assert "--disable-overlap-schedule" in off[0]["command"]
    first = reasons.index(adaptive[0]["reason"])
    assert any("chain ladder" in r for r in reasons[:first])
