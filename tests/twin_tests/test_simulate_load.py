"""Under load the in-process simulation serves what the HTTP twin serves: one batch model.

One configuration at concurrency 1, 8 and 32 through a twin server (HTTP) and in process (the
same engine on a virtual clock, what :class:`~rayspec.testing.SimulatedTrials` runs per load),
with the profile's noise off. Over HTTP the figures are read on the twin's own simulated clock,
so the comparison does not depend on how busy the host is (see the first test for what is left).
"""

from __future__ import annotations

import asyncio
import os
import statistics

import pytest
import yaml

from rayspec import Candidate
from rayspec import SpecSettings
from rayspec._config import load_config
from rayspec.bench import Scenario
from rayspec.bench import StreamClient
from rayspec.bench import request_input
from rayspec.server import build_launch
from rayspec.testing import SimulatedTrials
from rayspec.testing._twin import TwinProcess
from rayspec.twin import load_profile
from rayspec.twin._simulate import LoadAsk
from rayspec.twin._simulate import SimulatedServer
from rayspec.twin._text import count_prompt_tokens
from tests.helpers import TWIN_EXPERIMENT
from tests.helpers import without_noise

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


async def _wave(url: str, asks: list, c: int) -> list:
    """One wave of ``c`` requests at once, timed by the twin's clock (``meta_info``)."""
    async with StreamClient(url, max_streams=c, clock="twin") as client:
        return await asyncio.gather(
            *(client.stream(a.prompt, a.max_tokens, twin_clock=True) for a in asks)
        )


def _mean(values) -> float:
    return statistics.mean(values)


def test_each_load_is_served_in_process_as_the_http_twin_serves_it(tmp_path) -> None:
    """Concurrency 1, 8 and 32, two waves each, through the HTTP twin and in process.

    Over HTTP the figures are read on the twin's simulated clock (every chunk's
    ``meta_info.rayspec_twin``), so the host's speed drops out and the one difference left is
    how the wave reached the engine: in process its requests arrive together and are admitted
    as one prefill; over HTTP they may arrive around a prefill and be admitted in k batches
    (counted in the twin's ``Prefill batch`` lines). With one batch the two agree to the float
    (noise off, the same draws per request index); with k batches the HTTP requests wait at
    most k - 1 more whole-wave prefills, and a request of an earlier, smaller batch may start
    up to one whole-wave prefill sooner.
    """
    cfg = load_config(TWIN_EXPERIMENT, [f"server.twin.profile={_quiet_profile(str(tmp_path))}"])
    cand = Candidate(nccl_env=LL_SYS, spec=SpecSettings("EAGLE3", 2, 1, 3))
    args, env = _http_args(cfg, cand, trial=3)
    sim = SimulatedServer(args, env)  # noise off: no start factor, no per-request draws
    itl_at = {}
    with TwinProcess(args, env=env) as twin:
        twin.wait_ready()
        for c in LOADS:
            sc = Scenario(name=f"c{c}", concurrency=c, requests_per_run=c, max_tokens=TOKENS)
            for run in range(2):
                asks = [request_input(sc, run, i) for i in range(c)]
                before = twin.log().count("Prefill batch")
                http = asyncio.run(_wave(twin.base_url, asks, c))
                batches = twin.log().count("Prefill batch") - before
                sizes = [count_prompt_tokens(a.prompt) for a in asks]
                if c == 1:  # the field protocol's path: request by request
                    mine = [sim.generate(sizes[0], TOKENS)]
                    got = (mine[0].e2e_ms, mine[0].ttft_ms, _mean(mine[0].itl_ms))
                else:
                    served = sim.serve([LoadAsk(n, TOKENS) for n in sizes], c)
                    got = (_mean(r.e2e_ms for r in served), _mean(r.ttft_ms for r in served),
                           _mean(x for r in served for x in r.itl_ms))  # fmt: skip
                want = (_mean(r.e2e_s * 1000 for r in http), _mean(r.ttft_s * 1000 for r in http),
                        _mean(x * 1000 for r in http for x in r.itl_s))  # fmt: skip
                seen = f"c{c} run {run}: {batches} prefill batches; in process {got}, HTTP {want}"
                assert sum(r.completion_tokens for r in http) == c * TOKENS
                if batches == 1:
                    assert got == pytest.approx(want, rel=1e-9), seen
                else:
                    # A request of an earlier, smaller batch gets its first token sooner
                    # than the whole wave's prefill would give it (seen under load: the wave
                    # split 2 ways, the mean TTFT 0.4 ms below), by at most that prefill.
                    whole = sim.model.prefill_ms(sum(sizes))
                    extra = (batches - 1) * whole
                    for i in (0, 1):  # e2e, TTFT
                        assert got[i] - whole <= want[i] + 1e-6 <= got[i] + extra + 1e-6, seen
                    assert got[2] == pytest.approx(want[2], rel=0.05), seen
                itl_at[c] = got[2]
    assert itl_at[1] < itl_at[8] < itl_at[32]  # one decode step per load: the batch model's


def test_simulated_trials_measure_every_scenario_per_load(tmp_path) -> None:
    """A study's scenarios at concurrency 1, 8 and 32 in one simulated trial: tok/s, TTFT and
    ITL come out per load (the batch-1 rows carry ITL too), and load buys throughput."""
    cfg = load_config(TWIN_EXPERIMENT, [SCENARIOS, "bench.repeats=2", f"output.dir={tmp_path}"])
    m = SimulatedTrials()(
        cfg, 3, Candidate(nccl_env=LL_SYS, spec=SpecSettings("EAGLE3", 2, 1, 3))
    ).metrics
    assert m["tok_s_mean"] < m["c8__tok_s_mean"] < m["c32__tok_s_mean"]
    assert m["itl_ms_mean"] < m["c8__itl_ms_mean"] < m["c32__itl_ms_mean"]
    assert m["ttft_ms_mean"] < m["c32__ttft_ms_mean"]  # one prefill of the whole wave
    assert m["runs"] == 2.0 and m["c32__runs"] == 2.0


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


def test_a_load_keeps_each_requests_category(tmp_path) -> None:
    """Under load too a request's prompt category scales its acceptance (the engine's
    ``submit(category=...)``, as over HTTP)."""
    cfg = load_config(TWIN_EXPERIMENT)
    args, env = _http_args(
        cfg, Candidate(nccl_env=LL_SYS, spec=SpecSettings("EAGLE3", 2, 1, 3)), 4
    )
    sim = SimulatedServer(args, env, without_noise(load_profile(cfg.server.twin.profile)))
    served = sim.serve([LoadAsk(20, 400, category=c) for c in ["code"] * 8 + ["chat"] * 8], 16)
    accept = [r.completion_tokens / r.verify_ct for r in served if r.verify_ct]
    assert statistics.mean(accept[:8]) > 1.03 * statistics.mean(accept[8:])
