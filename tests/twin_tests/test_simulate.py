"""The in-process simulation of a twin server start: the HTTP twin's tokens, its failures."""

from __future__ import annotations

import pytest

from rayspec import Candidate
from rayspec import SpecSettings
from rayspec._config import load_config
from rayspec.bench import request_input
from rayspec.bench import run_benchmark_detailed
from rayspec.server import build_launch
from rayspec.testing._twin import TwinProcess
from rayspec.tune._trial import bench_plan
from rayspec.twin._simulate import SimulatedServer
from rayspec.twin._simulate import SimulatedStartupError
from rayspec.twin._text import count_prompt_tokens
from tests.helpers import TWIN_EXPERIMENT

LL_SYS = (("NCCL_P2P_LEVEL", "SYS"), ("NCCL_PROTO", "LL"))


def _argv(cfg, cand: Candidate, trial: int = 5) -> tuple[list[str], dict[str, str]]:
    launch = build_launch(cfg, cand, port=0, log_path="-", trial=trial)
    args = list(launch.argv[3:])
    for flag in ("--port", "--host"):  # TwinProcess picks its own
        i = args.index(flag)
        del args[i : i + 2]
    return args, dict(launch.env)


def test_the_simulation_draws_what_the_http_twin_serves() -> None:
    cfg = load_config(TWIN_EXPERIMENT, ["bench.max_tokens=120", "bench.repeats=2"])
    cand = Candidate(nccl_env=LL_SYS, spec=SpecSettings("EAGLE3", 2, 4, 6))
    args, env = _argv(cfg, cand)
    plan = bench_plan(cfg)
    with TwinProcess(args, env=env) as twin:
        twin.wait_ready()
        served = run_benchmark_detailed(twin.base_url, plan).records
    sim = SimulatedServer(args, env)
    scenario = plan.scenarios[0]
    for rec in served:
        ask = request_input(scenario, rec.run, rec.index)
        got = sim.generate(count_prompt_tokens(ask.prompt), ask.max_tokens)
        assert got.completion_tokens == rec.completion_tokens
        assert got.verify_ct == rec.spec_verify_ct  # the same cycle draws, request by request
        assert got.e2e_ms == pytest.approx(rec.e2e_ms, rel=0.05)  # the schedule, not the jitter


@pytest.mark.parametrize(
    ("env", "spec", "reason"),
    [
        ({"NCCL_PROTO": "LL256"}, None, "nccl_init"),
        ({"NCCL_ALGO": "CollNetDirect"}, None, "nccl_first_collective"),
        ({}, SpecSettings("EAGLE3", 1, 2, 8), "invalid_draft_tree"),
    ],
)
def test_a_start_fails_as_the_twin_would(env, spec, reason) -> None:
    cfg = load_config(TWIN_EXPERIMENT)
    args, base_env = _argv(cfg, Candidate(nccl_env=tuple(sorted(env.items())), spec=spec))
    with pytest.raises(SimulatedStartupError) as info:
        SimulatedServer(args, {**base_env, **env})
    assert info.value.reason == reason


def test_greedy_output_is_the_prompts_whatever_the_trial_and_ll128_on_pcie_garbles_it() -> None:
    cfg = load_config(TWIN_EXPERIMENT)
    prompt = "Explain tensor parallelism."
    outs = {}
    for trial, nccl in ((1, LL_SYS), (2, (("NCCL_PROTO", "LL128"),)), (3, ())):
        args, env = _argv(cfg, Candidate(nccl_env=nccl, spec=SpecSettings("EAGLE3", 2, 1, 3)),
                          trial)  # fmt: skip
        outs[trial] = SimulatedServer(args, env).generate(5, 64, prompt).output_ids
    assert outs[1] == outs[3] and outs[1] is not None and len(outs[1]) == 64
    assert outs[2] != outs[1]
    first = next(i for i, (a, b) in enumerate(zip(outs[1], outs[2], strict=True)) if a != b)
    assert first < 16  # early: not a late numeric drift


def test_a_twin_study_is_timed_by_the_twin_clock_the_simulation_computes() -> None:
    """A twin study's plan times requests by the twin's simulated clock: the unpaced twin
    (``--twin-realtime false`` answers as fast as the host can) measures exactly the schedule
    of the simulation, TTFT and E2E, whatever the host's speed."""
    cfg = load_config(TWIN_EXPERIMENT, ["bench.max_tokens=80", "bench.repeats=3"])
    cand = Candidate(nccl_env=LL_SYS, spec=SpecSettings("EAGLE3", 2, 4, 6))
    args, env = _argv(cfg, cand)
    plan = bench_plan(cfg)
    assert plan.clock == "twin"
    with TwinProcess([*args, "--twin-realtime", "false"], env=env) as twin:
        twin.wait_ready()
        served = run_benchmark_detailed(twin.base_url, plan).records
    sim = SimulatedServer(args, env)
    scenario = plan.scenarios[0]
    assert len(served) == 4  # the warm-up and 3 runs
    for rec in served:
        ask = request_input(scenario, rec.run, rec.index)
        got = sim.generate(count_prompt_tokens(ask.prompt), ask.max_tokens)
        assert rec.ok and got.completion_tokens == rec.completion_tokens
        assert rec.ttft_ms == pytest.approx(got.ttft_ms, rel=1e-9)
        assert rec.e2e_ms == pytest.approx(got.e2e_ms, rel=1e-9)
        assert sum(rec.itl_ms) == pytest.approx(got.e2e_ms - got.ttft_ms, rel=1e-9)
