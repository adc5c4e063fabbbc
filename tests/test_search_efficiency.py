"""The search benchmark's truth, cases and noise scaling (benchmarks/search_efficiency.py): no
study is run here, only the noise-free model the table is judged against."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from rayspec._types import Candidate
from rayspec.twin import load_profile
from tests.helpers import load_benchmark
from tests.helpers import without_noise


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("search_efficiency")


def _hand_tuned(bench: ModuleType, case: str) -> Candidate:
    cfg = bench.truth_config(case)
    space = bench.SearchSpace.from_config(cfg.search)
    return space.candidate(space.coerce(cfg.study.enqueue[0]))  # type: ignore[no-any-return]


def test_a_configuration_whose_first_collective_hangs_is_worth_0(bench: ModuleType) -> None:
    # The hand-tuned setting (NCCL_P2P_LEVEL=SYS) puts every ring link on P2P: on a node with
    # broken P2P its server never gets ready. The same speculation with NCCL's default (PXB:
    # this node's links stay on SHM) starts and decodes.
    tuned = _hand_tuned(bench, "p2p/quick")
    assert dict(tuned.nccl_env)["NCCL_P2P_LEVEL"] == "SYS"
    assert bench.true_tok_s(bench.truth_config("p2p/quick"), tuned) == 0.0
    default = Candidate(spec=tuned.spec)
    assert bench.true_tok_s(bench.truth_config("p2p/quick"), default) > 50.0
    assert bench.true_tok_s(bench.truth_config("field/quick"), tuned) > 90.0


def test_the_optimum_and_floor_of_a_p2p_broken_node_start(bench: ModuleType) -> None:
    value, best = bench.optimum_at("p2p/quick")
    assert dict(best.nccl_env).get("NCCL_P2P_LEVEL") not in ("PHB", "SYS")
    assert value < bench.optimum("field/quick")  # the field's best setting is out of reach
    # The enqueued floor hangs, so the floor is the baseline (no speculation, NCCL unset).
    baseline = bench.true_tok_s(bench.truth_config("p2p/quick"), Candidate())
    assert bench.floor_of("p2p/quick") == pytest.approx(baseline)
    assert 0.0 < baseline < value


def test_the_deep_profile_has_its_optimum_at_the_space_edge(bench: ModuleType) -> None:
    for case in ("deep/quick", "deep/full"):
        cfg = bench.truth_config(case)
        space = bench.SearchSpace.from_config(cfg.search)
        _, best = bench.optimum_at(case)
        assert best.spec is not None
        assert best.spec.num_steps == max(space.num_steps), case
    assert bench.truth_config("deep/full").server.tp_size == 4


def test_noise_scaling_goes_through_a_derived_profile(bench: ModuleType, tmp_path: str) -> None:
    base = load_profile("kimi-k2.5-tp8-pcie")
    start = load_profile(bench.noisy_profile("kimi-k2.5-tp8-pcie", 3.0, 1.0, str(tmp_path)))
    assert start.noise.sigma_start == pytest.approx(3 * base.noise.sigma_start)
    assert start.noise.sigma_accept == base.noise.sigma_accept
    assert without_noise(start) == without_noise(base)  # same name, same model
    both = load_profile(bench.noisy_profile("kimi-k2.5-tp8-pcie", 3.0, 2.0, str(tmp_path)))
    assert both.noise.sigma_start == pytest.approx(6 * base.noise.sigma_start)
    assert both.noise.sigma_time == pytest.approx(2 * base.noise.sigma_time)
    assert both.noise.sigma_accept == pytest.approx(2 * base.noise.sigma_accept)
    assert bench.CASE_NOISE["field3x/full"] == (3.0, 1.0)


def test_grid_is_left_out_on_the_full_space_only(bench: ModuleType) -> None:
    tasks, skipped = bench.plan(["deep/quick", "deep/full"], ["structured", "grid"], 2, 40)
    assert skipped == (("deep/full", "grid"),)
    assert sorted({(t[0], t[1]) for t in tasks}) == [
        ("deep/full", "structured"),
        ("deep/quick", "grid"),
        ("deep/quick", "structured"),
    ]
    assert len(tasks) == 6


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--noise-scale", "-1"], "--noise-scale must be a number >= 0"),
        (["--strategies", "structured,cmaes"], "unknown strategy 'cmaes'"),
        (["--cases", "deep/huge"], "unknown case 'deep/huge'"),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    bench: ModuleType, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_the_ladder_truth_is_what_a_noise_free_run_at_each_load_measures(
    bench: ModuleType,
) -> None:
    """A ladder case's truth per load: the model's decode rate in waves of the running-batch
    cap; noise-free in-process runs (the twin's scheduler) lie 0-10 % below it (their prefill,
    and each wave ending with its slowest request: per-cycle draws spread a speculative
    request's length), and speculation loses at load."""
    import os

    from rayspec._types import SpecSettings
    from rayspec.bench import Scenario
    from rayspec.bench import request_input
    from rayspec.server import build_launch
    from rayspec.twin._simulate import LoadAsk
    from rayspec.twin._simulate import SimulatedServer
    from rayspec.twin._text import count_prompt_tokens

    case = "field/ladder"
    cfg = bench.truth_config(case)
    ll = (("NCCL_P2P_LEVEL", "SYS"), ("NCCL_PROTO", "LL"))
    chain = Candidate(nccl_env=ll, spec=SpecSettings("EAGLE3", 2, 1, 3))
    assert bench.true_tok_s_at(case, chain, 1) == bench.true_tok_s(cfg, chain)
    profile = without_noise(load_profile(cfg.server.twin.profile))
    for cand in (Candidate(nccl_env=ll), chain):
        launch = build_launch(cfg, cand, port=0, log_path=os.devnull, trial=1)
        server = SimulatedServer(launch.argv[3:], dict(launch.env), profile)
        for c in (8, 64):
            sc = Scenario(name=f"c{c}", concurrency=c, requests_per_run=c, max_tokens=200)
            runs = []
            for run in range(3):
                asks = [request_input(sc, run, i) for i in range(c)]
                served = server.serve(
                    [LoadAsk(count_prompt_tokens(a.prompt), a.max_tokens) for a in asks], c
                )
                wall = max(r.sent_s + r.e2e_ms / 1000.0 for r in served)
                runs.append(sum(r.completion_tokens for r in served) / wall)
            truth = bench.true_tok_s_at(case, cand, c)
            assert 0.9 * truth < sum(runs) / len(runs) < truth
    assert bench.optimum_at_load(case, 32)[1].spec is None
    assert bench.optimum_at_load(case, 1)[1].spec is not None


def test_the_goodput_truth_is_the_noise_free_latency_at_the_load(bench: ModuleType) -> None:
    """The goodput case's truth: the noise-free TTFT (the wave's one prefill) and per-request
    p99 gap (a one-token cycle of the full batch at the end of the output) that a noise-free
    in-process wave at c32 measures, within 1 %; its SLO splits the configurations (no
    speculation with the best NCCL sets meets it, the baseline and speculation miss it)."""
    import os

    import numpy as np

    from rayspec._types import SpecSettings
    from rayspec.bench import Scenario
    from rayspec.bench import request_input
    from rayspec.server import build_launch
    from rayspec.twin._simulate import LoadAsk
    from rayspec.twin._simulate import SimulatedServer
    from rayspec.twin._text import count_prompt_tokens

    case = "field/goodput"
    load = bench.GOODPUT_CASES[case]
    cfg = bench.truth_config(case)
    assert cfg.study.objective == "goodput" and cfg.scenarios()[0].name == f"c{load}"
    ll = (("NCCL_P2P_LEVEL", "SYS"), ("NCCL_PROTO", "LL"))
    best = Candidate(nccl_env=ll)
    chain = Candidate(nccl_env=ll, spec=SpecSettings("EAGLE3", 2, 1, 3))
    profile = without_noise(load_profile(cfg.server.twin.profile))
    sc = Scenario(name=f"c{load}", concurrency=load, requests_per_run=load, max_tokens=200)
    asks = [request_input(sc, 0, i) for i in range(load)]
    for cand in (best, chain):
        launch = build_launch(cfg, cand, port=0, log_path=os.devnull, trial=1)
        server = SimulatedServer(launch.argv[3:], dict(launch.env), profile)
        served = server.serve(
            [LoadAsk(count_prompt_tokens(a.prompt), a.max_tokens) for a in asks], load
        )
        ttft, itl = bench.true_latency_at(case, cand, load)
        assert max(r.ttft_ms for r in served) == pytest.approx(ttft, rel=0.01)
        gaps = [float(np.percentile(r.itl_ms, 99)) for r in served]  # as bench._slo takes it
        assert max(gaps) == pytest.approx(itl, rel=0.01)
    assert bench.truly_meets_slo(case, best) and not bench.truly_meets_slo(case, chain)
    assert not bench.truly_meets_slo(case, Candidate())  # the baseline: NCCL unset
    assert bench.optimum_at(case) == (bench.true_tok_s_at(case, best, load), best)


def test_a_plans_truth_is_its_tier_chain_plus_adaptive_cost_and_what_a_run_measures(
    bench: ModuleType, tmp_path
) -> None:
    """A plan's truth at a load: its tier's chain (or plain decoding) with its NCCL set, every
    iteration paying the profile's adaptive_ms; a noise-free in-process run of the adaptive
    server with those tiers lies 0-10 % below it, and the best per-load plan follows the
    per-load optima (a chain at 1, no speculation under load) below them by adaptive's cost."""
    import os

    from rayspec._types import SpecSettings
    from rayspec.bench import Scenario
    from rayspec.bench import request_input
    from rayspec.results import Plan
    from rayspec.server import build_launch
    from rayspec.server._files import with_files
    from rayspec.twin._simulate import LoadAsk
    from rayspec.twin._simulate import SimulatedServer
    from rayspec.twin._text import count_prompt_tokens

    case = "field/ladder"
    cfg = bench.truth_config(case)
    ll = (("NCCL_P2P_LEVEL", "SYS"), ("NCCL_PROTO", "LL"))
    plan = Plan(((1, (2,)), (8, (0,))), ll, "EAGLE3", 2)
    off = bench.true_tok_s_at(case, Candidate(nccl_env=ll), 8)
    assert 0.98 * off < bench.true_plan_at(case, plan, 8) < off  # adaptive costs, a little
    profile = without_noise(load_profile(cfg.server.twin.profile))
    launch = build_launch(cfg, plan.candidate(), port=0, log_path=os.devnull, trial=1)
    started = with_files(launch, str(tmp_path))
    server = SimulatedServer(started.argv[3:], dict(started.env), profile)
    sc = Scenario(name="c8", concurrency=8, requests_per_run=8, max_tokens=200)
    asks = [request_input(sc, 0, i) for i in range(8)]
    served = server.serve([LoadAsk(count_prompt_tokens(a.prompt), a.max_tokens) for a in asks], 8)
    wall = max(r.sent_s + r.e2e_ms / 1000.0 for r in served)
    measured = sum(r.completion_tokens for r in served) / wall
    assert 0.9 * bench.true_plan_at(case, plan, 8) < measured < bench.true_plan_at(case, plan, 8)
    values, best = bench.best_plan_at(case)
    assert [best.steps_at(c) for c in bench.LADDER] == [2, 0, 0, 0]
    chain = bench.true_tok_s_at(
        case, Candidate(nccl_env=ll, spec=SpecSettings("EAGLE3", 2, 1, 3)), 1
    )
    assert 0.98 * chain < values[0] < chain  # a tree is faster at 1, but adaptive needs topk 1
    for c, value in zip(bench.LADDER[1:], values[1:], strict=True):
        assert 0.98 * bench.optimum_at_load(case, c)[0] < value < bench.optimum_at_load(case, c)[0]


def test_the_mixed_truth_is_the_mix_of_categories_a_noise_free_run_measures(
    bench: ModuleType,
) -> None:
    """The mixed-category ladder's truth: each request's acceptance scaled by its category's
    ``drafter.category_mult``, the mean of per-request rates at concurrency 1 and a wave whose
    high-acceptance requests finish first under load. Noise-free in-process runs (each request
    sent with its category, as the simulated trials do) move against the same runs on the
    default prompts as the truth does: within 1 % at concurrency 1 (a category-blind truth is
    1.3-1.7 % off there), within 2 % under load."""
    import os
    import statistics

    from rayspec._types import SpecSettings
    from rayspec.bench import request_input
    from rayspec.server import build_launch
    from rayspec.twin._simulate import LoadAsk
    from rayspec.twin._simulate import SimulatedServer
    from rayspec.twin._text import count_prompt_tokens

    def measured(case: str, cand: Candidate, load: int) -> float:
        cfg = bench.truth_config(case)
        profile = without_noise(load_profile(cfg.server.twin.profile))
        launch = build_launch(cfg, cand, port=0, log_path=os.devnull, trial=1)
        server = SimulatedServer(launch.argv[3:], dict(launch.env), profile)
        sc = next(s for s in bench.bench_plan(cfg).scenarios if s.name == f"c{load}")
        if load == 1:  # 16 runs of one request: every category 4 times
            asks = [request_input(sc, run, 0) for run in range(16)]
            got = [server.generate(count_prompt_tokens(a.prompt), a.max_tokens, None, a.category)
                   for a in asks]  # fmt: skip
            return statistics.mean(r.completion_tokens / (r.e2e_ms / 1000.0) for r in got)
        runs = []
        for run in range(6):  # a wave's end (its slowest request) spreads a run's rate
            asks = [request_input(sc, run, i) for i in range(load)]
            served = server.serve(
                [LoadAsk(count_prompt_tokens(a.prompt), a.max_tokens, category=a.category)
                 for a in asks], load,
            )  # fmt: skip
            wall = max(r.sent_s + r.e2e_ms / 1000.0 for r in served)
            runs.append(sum(r.completion_tokens for r in served) / wall)
        return statistics.mean(runs)

    cfg = bench.truth_config("field/mixed")
    assert {s.prompt_set for s in bench.bench_plan(cfg).scenarios} == {"mixed"}
    ll = (("NCCL_P2P_LEVEL", "SYS"), ("NCCL_PROTO", "LL"))
    off = Candidate(nccl_env=ll)
    chain = Candidate(nccl_env=ll, spec=SpecSettings("EAGLE3", 2, 1, 3))
    tree = Candidate(nccl_env=ll, spec=SpecSettings("EAGLE3", 3, 4, 8))
    assert bench.case_truth("field/mixed", chain) == bench.true_tok_s_at("field/mixed", chain, 1)
    for c in bench.LADDER:  # no speculation: the category does not matter
        no_spec = bench.true_tok_s_at("field/mixed", off, c)
        assert no_spec == pytest.approx(bench.true_tok_s_at("field/ladder", off, c), rel=0.002)
    for cand in (chain, tree):
        for load, tol in ((1, 0.01), (8, 0.02), (32, 0.02), (64, 0.02)):
            truth = bench.true_tok_s_at("field/mixed", cand, load)
            mixed = measured("field/mixed", cand, load)
            assert 0.9 * truth < mixed < truth
            want = truth / bench.true_tok_s_at("field/ladder", cand, load)
            got = mixed / measured("field/ladder", cand, load)
            assert got == pytest.approx(want, rel=tol), (cand.spec, load)
    assert bench.optimum_at("field/mixed")[1].spec is not None
    assert bench.optimum_at_load("field/mixed", 32)[1].spec is None


def test_the_outside_form_cases_change_one_speculative_mechanism_each(bench: ModuleType) -> None:
    """Each variant is the field node with one mechanism changed: no speculation keeps the
    field's truth, some speculative setting's truth moves, and every case has a quick and a
    full space."""
    from rayspec._types import SpecSettings

    field = bench.truth_config("field/quick")
    ll = (("NCCL_P2P_LEVEL", "SYS"), ("NCCL_PROTO", "LL"))
    probes = [Candidate(nccl_env=ll, spec=SpecSettings("EAGLE3", k, m, n))
              for k, m, n in ((2, 1, 3), (4, 1, 5), (2, 4, 6), (3, 2, 6))]  # fmt: skip
    for name in bench.outside.VARIANTS:
        assert {f"{name}/quick", f"{name}/full"} <= set(bench.OUTSIDE_CASES)
        assert bench.FULL_SPACE in bench.CASES[f"{name}/full"]
        cfg = bench.truth_config(f"{name}/quick")
        assert load_profile(cfg.server.twin.profile).name == f"kimi-k2.5-tp8-pcie-{name}"
        plain = Candidate(nccl_env=ll)
        assert bench.true_tok_s(cfg, plain) == pytest.approx(bench.true_tok_s(field, plain))
        moved = [abs(bench.true_tok_s(cfg, c) / bench.true_tok_s(field, c) - 1) for c in probes]
        assert max(moved) > 0.005, name
    # The staircase: a 4-step chain verifies 5 tokens, which run as 8 in the captured graph.
    graphs = bench.truth_config("graphs/quick")
    chain4 = probes[1]
    assert bench.true_tok_s(graphs, chain4) < bench.true_tok_s(field, chain4)
    assert bench.optimum_at("graphs/quick")[1].spec.num_draft_tokens == 8


def test_the_stop_lines_probability_and_the_calibration_count(bench: ModuleType) -> None:
    said = bench.outside.stop_probability(
        "converged: P(the likeliest of 11 rivals (3 steps, topk 4, 6 tokens) beats the pick, "
        "trial 5, by >1 %) = 12.4 % < 20 %"
    )
    assert said == 12.4
    gain = bench.outside.stop_probability(
        "converged: another restart is expected to gain the pick 0.21 % at most (trial 9) < "
        "0.25 %, though P(the likeliest of 7 rivals (trial 9) beats the pick, trial 12, by "
        ">1 %) = 31.0 %"
    )
    assert gain == 31.0
    assert bench.outside.stop_probability("restart budget spent (40 server launches)") is None
    # Of the stops that said < 20 %, the picks the optimum (100) beats by more than 1 %.
    finals = [100.0, 98.5, 99.5, 90.0, 97.0]
    stops = [12.4, 5.0, 19.9, None, 31.0]
    assert bench.outside.calibration(finals, stops, 100.0) == (1, 3)


def test_a_real_case_replays_its_landscape(bench: ModuleType, tmp_path: Any) -> None:
    """A recorded landscape (a synthetic one here) is a real/<drafter> case: its space and
    protocol are the recording's, its truth the recorded means, and a study of it runs the
    real study loop on the replayed starts."""
    from rayspec.testing import ReplayedTrials
    from rayspec.testing import synthetic_landscape

    land = synthetic_landscape(tmp_path / "cpu-toy.parquet", starts=3, runs=4, seed=5)
    assert bench.register_landscapes(str(tmp_path)) == {"real/toy": land.path}
    case = "real/toy"
    cfg = bench.truth_config(case)
    replay = ReplayedTrials(land.path)
    space = bench.SearchSpace.from_config(cfg.search)
    recorded = {bench.Candidate(spec=spec).label() for spec in _specs(space)}
    assert recorded == set(replay.settings)  # the space is the recorded settings
    assert (cfg.bench.warmup, cfg.bench.repeats, cfg.bench.max_tokens) == (1, 4, 64)
    assert len(replay.settings) == 8  # no speculation, 3 chains, 4 trees
    value, best = bench.optimum_at(case)
    assert value == max(replay.truth(s) for s in replay.settings)
    assert best.label() == max(replay.settings, key=replay.truth)
    assert bench.floor_of(case) == pytest.approx(replay.truth(Candidate()))
    run = bench.one_study(case, "structured", 0, 8)
    truths = {replay.truth(s) for s in replay.settings}
    assert run.used <= 8 and all(p in truths for p in run.picks[: run.used])
    assert bench.outside.landscape_shape(land.path).startswith(f"{len(recorded)} settings x 3+")


def _specs(space: Any) -> list[Any]:
    from rayspec._types import SpecSettings

    out: list[Any] = [None]
    for k in space.num_steps:
        for m in space.eagle_topk:
            for n in [k + 1] if m == 1 else space.num_draft_tokens:
                spec = SpecSettings("EAGLE3", k, m, n)
                if spec.fits_tree:
                    out.append(spec)
    return out
