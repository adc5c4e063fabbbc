"""Under load the in-process simulation serves what the HTTP twin serves: one batch model.

One configuration at concurrency 1, 8 and 32 through a twin server (HTTP, paced by the wall
clock) and through :class:`~rayspec.testing.SimulatedTrials` (the same engine on a virtual
clock). The profile's noise is off, so what is left between the two is the HTTP side's: the
client's and the host's latency, and how the first wave of a run reaches the engine (over HTTP
the requests of a wave may arrive around a prefill and be admitted in two prefill batches; in
process they arrive together). The tolerances below say how much of each is allowed.
"""

from __future__ import annotations

import os

import pytest
import yaml

from rayspec import Candidate
from rayspec import SpecSettings
from rayspec._config import load_config
from rayspec.bench import run_benchmark_detailed
from rayspec.bench import summarize
from rayspec.server import build_launch
from rayspec.testing import SimulatedTrials
from rayspec.testing._twin import TwinProcess
from rayspec.tune._trial import bench_plan
from rayspec.twin._simulate import LoadAsk
from rayspec.twin._simulate import SimulatedServer
from tests.helpers import TWIN_EXPERIMENT

LL_SYS = (("NCCL_P2P_LEVEL", "SYS"), ("NCCL_PROTO", "LL"))
LOADS = (1, 8, 32)
TOKENS = 64
SCENARIOS = (
    "bench.scenarios=["
    + ",".join(
        f"{{name: c{c}, concurrency: {c}, requests_per_run: {c}, max_tokens: {TOKENS}}}"
        for c in LOADS
    )
    + "]"
)


def _quiet_profile(folder: str) -> str:
    """The field profile with its noise off (``noise: off``), as a file the twin can load."""
    from importlib import resources

    ref = resources.files("rayspec.twin").joinpath("profiles", "kimi-k2.5-tp8-pcie.yaml")
    data = yaml.safe_load(ref.read_text(encoding="utf-8"))
    data["noise"] = False  # YAML `noise: off`
    path = os.path.join(folder, "quiet.yaml")
    with open(path, "w", encoding="utf-8") as fh:
        yaml.safe_dump(data, fh, sort_keys=False)
    return path


def _http_args(cfg, cand: Candidate, trial: int) -> tuple[list[str], dict[str, str]]:
    launch = build_launch(cfg, cand, port=0, log_path="-", trial=trial)
    args = list(launch.argv[3:])
    for flag in ("--port", "--host"):  # TwinProcess picks its own port (from the OS)
        i = args.index(flag)
        del args[i : i + 2]
    return args, dict(launch.env)


@pytest.mark.parametrize("spec", [SpecSettings("EAGLE3", 2, 1, 3)])
def test_simulated_trials_measure_each_load_as_the_http_twin(tmp_path, spec) -> None:
    cfg = load_config(
        TWIN_EXPERIMENT,
        [SCENARIOS, "bench.repeats=2", "bench.warmup=1", f"output.dir={tmp_path}",
         f"server.twin.profile={_quiet_profile(str(tmp_path))}"],
    )  # fmt: skip
    cand = Candidate(nccl_env=LL_SYS, spec=spec)
    args, env = _http_args(cfg, cand, trial=3)
    with TwinProcess(args, env=env) as twin:
        twin.wait_ready()
        served = run_benchmark_detailed(twin.base_url, bench_plan(cfg)).records
    sim = SimulatedTrials()(cfg, 3, cand).metrics
    model = SimulatedServer(args, env).model
    for c in LOADS:
        http = summarize(served, scenario=f"c{c}")
        prefix = "" if c == LOADS[0] else f"c{c}__"
        tok_s, ttft, itl = (sim[prefix + k] for k in ("tok_s_mean", "ttft_ms_mean", "itl_ms_mean"))
        if c == 1:  # timed by the twin's clock over HTTP: the same schedule, to the float
            assert tok_s == pytest.approx(http["tok_s_mean"], rel=1e-9)
            assert ttft == pytest.approx(http["ttft_ms_mean"], rel=1e-9)
            assert itl == pytest.approx(http["itl_ms_mean"], rel=1e-9)
            continue
        # Decode iterations: the batch model's step at batch c, paced on the wall clock over
        # HTTP (a late iteration is caught up by the next): measured 0.2-1 % apart here.
        assert itl == pytest.approx(http["itl_ms_mean"], rel=0.05)
        # The first wave: in process one prefill of all c requests; over HTTP they may reach
        # the engine around a prefill and be admitted in two or three batches (seen in the
        # twin's Prefill lines), each one more prefill (50 ms base) before the late requests'
        # first token. So the simulation is never slower, and at most two whole-wave prefills
        # faster, plus the client's latency (30 ms).
        wave = model.prefill_ms(
            max(sum(r.prompt_tokens for r in served if r.scenario == f"c{c}" and r.run == run)
                for run in (0, 1))
        )  # fmt: skip
        assert ttft <= http["ttft_ms_mean"] * 1.02
        assert http["ttft_ms_mean"] <= ttft + 2 * wave + 30.0
        # Throughput: that delay of the wave against a run of ~TOKENS / L cycles (1-2 s):
        # measured 3 % (c8) and 6 % (c32) faster in process; 10 % allowed.
        assert tok_s == pytest.approx(http["tok_s_mean"], rel=0.10)
        assert tok_s >= http["tok_s_mean"] * 0.98


def test_arrivals_far_apart_are_served_as_the_batch_1_path_serves_them() -> None:
    """Poisson-like arrivals that never overlap: each request runs alone in the twin's
    scheduler, so the load path meets the request-by-request path (same draws per index)."""
    cfg = load_config(TWIN_EXPERIMENT)
    args, env = _http_args(
        cfg, Candidate(nccl_env=LL_SYS, spec=SpecSettings("EAGLE3", 2, 1, 3)), 4
    )
    alone, loaded = SimulatedServer(args, env), SimulatedServer(args, env)
    prompts = (12, 40, 7, 25)
    want = [alone.generate(p, 90) for p in prompts]
    got = loaded.serve([LoadAsk(p, 90, due_s=100.0 * i) for i, p in enumerate(prompts)], 8)
    for w, g in zip(want, got, strict=True):
        assert (g.completion_tokens, g.verify_ct) == (w.completion_tokens, w.verify_ct)
        assert g.ttft_ms == pytest.approx(w.ttft_ms, rel=1e-9)
        assert g.e2e_ms == pytest.approx(w.e2e_ms, rel=1e-9)
        assert g.itl_ms == pytest.approx(w.itl_ms, rel=1e-9)


def test_a_poisson_scenario_measures_per_load_in_process(tmp_path) -> None:
    """``request_rate`` scenarios run in process too: the arrivals are the bench's, so a
    slower rate leaves the engine idle between requests and measures fewer tokens/s."""
    sc = "{{name: {n}, concurrency: 16, requests_per_run: 24, max_tokens: 60{r}}}"
    cfg = load_config(
        TWIN_EXPERIMENT,
        ["bench.scenarios=[" + ",".join([sc.format(n="loop", r=""),
                                         sc.format(n="fast", r=", request_rate: 50.0"),
                                         sc.format(n="slow", r=", request_rate: 2.0")]) + "]",
         "bench.repeats=2", f"output.dir={tmp_path}"],
    )  # fmt: skip
    cand = Candidate(nccl_env=LL_SYS, spec=SpecSettings("EAGLE3", 2, 1, 3))
    first = SimulatedTrials()(cfg, 2, cand).metrics
    again = SimulatedTrials()(cfg, 2, cand).metrics
    assert first["tok_s_mean"] == again["tok_s_mean"]  # a seeded trial repeats exactly
    assert first["tok_s_mean"] > first["fast__tok_s_mean"] > 2 * first["slow__tok_s_mean"]
    assert first["slow__itl_ms_mean"] < first["itl_ms_mean"]  # smaller batches, faster steps
