"""The engine loop in-process with a fake clock: absolute deadlines, catch-up, counters."""

from __future__ import annotations

import asyncio
import io
import random

import pytest

from rayspec._types import SpecSettings
from rayspec.twin import NoiseModel
from rayspec.twin import PerfModel
from rayspec.twin import load_profile
from rayspec.twin import resolve_nccl
from rayspec.twin._engine import Engine
from rayspec.twin._log import SglangLog
from tests.helpers import without_noise

TUNED = {"NCCL_PROTO": "LL", "NCCL_P2P_LEVEL": "SYS"}


class FakeClock:
    """A monotonic clock that only moves when the engine sleeps (plus injected lags)."""

    def __init__(self) -> None:
        self.now = 100.0
        self.lags: dict[int, float] = {}  # sleep call index -> extra seconds the loop oversleeps
        self.calls = 0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.now += delay + self.lags.get(self.calls, 0.0)
        self.calls += 1
        await asyncio.sleep(0)


def make_engine(clock: FakeClock, spec: SpecSettings | None = None, **kw: object) -> Engine:
    profile = without_noise(load_profile("kimi-k2.5-tp8-pcie"))
    model = PerfModel(profile, resolve_nccl(TUNED, profile), spec)
    noise = NoiseModel(profile.noise, random.Random(0), speculative=spec is not None)
    log = SglangLog((0, 5, 23), 8, stream=io.StringIO())
    return Engine(
        model,
        noise,
        log,
        max_running_requests=kw.pop("cap", 48),  # type: ignore[arg-type]
        version=(0, 5, 23),
        seed=0,
        clock=clock,
        sleep=clock.sleep,
        **kw,
    )  # type: ignore[arg-type]


async def emission_times(engine: Engine, clock: FakeClock, tokens: int) -> list[float]:
    engine.start()
    req = engine.submit(rid="r", prompt_tokens=4, max_new_tokens=tokens, output_ids=[0] * tokens)
    times = []
    async for _ in engine.updates(req):
        assert req.last_token_s is not None
        times.append(req.last_token_s)  # the engine's clock at the emission
    engine.close()
    return times


def test_late_wakeup_does_not_shift_later_deadlines() -> None:
    on_time, lagging = FakeClock(), FakeClock()
    lagging.lags = {10: 0.05}  # the 11th sleep wakes 50 ms late (a busy machine)
    a = asyncio.run(emission_times(make_engine(on_time), on_time, 60))
    b = asyncio.run(emission_times(make_engine(lagging), lagging, 60))
    assert len(a) == len(b) == 60
    late = [i for i in range(60) if b[i] - a[i] > 0.04]
    assert late, "the injected lag delayed no emission"
    first = late[0]
    assert b[first] == pytest.approx(a[first] + 0.05)  # the late emission ...
    assert b[first + 1] == pytest.approx(b[first])  # ... is followed at once by overdue ones
    assert late == list(range(first, first + len(late))) and len(late) < 6  # catch-up
    assert b[-1] == pytest.approx(a[-1])  # and the schedule ends exactly where it should
    # the pace is the model's: one step per token after the prefill
    model = make_engine(on_time).model
    step = (a[-1] - a[0]) / 59
    assert step * 1000 == pytest.approx(model.step_ms(1, 4 + 30), rel=0.01)


async def simulated_stamps(engine: Engine, clock: FakeClock, idle_s: float) -> list[float]:
    """Two requests one after another with ``idle_s`` of idle wall time between them: the
    simulated arrival and every emission's simulated stamp of both."""
    engine.start()
    stamps: list[float] = []
    for rid in ("a", "b"):
        req = engine.submit(rid=rid, prompt_tokens=4, max_new_tokens=40, output_ids=[0] * 40)
        stamps.append(req.sim_arrival_s)
        async for _ in engine.updates(req):
            assert req.sim_token_s is not None
            stamps.append(req.sim_token_s)
        clock.now += idle_s  # the client takes its time before the next request
    engine.close()
    return stamps


def test_the_simulated_clock_ignores_late_wakeups_and_idle_time() -> None:
    """The stamps the twin reports (meta_info.rayspec_twin) are the model's schedule: a loop
    that wakes late on a busy host and idle time between requests change none of them."""
    on_time, lagging = FakeClock(), FakeClock()
    lagging.lags = {3: 0.2, 10: 0.05, 50: 0.5}
    a = asyncio.run(simulated_stamps(make_engine(on_time), on_time, 0.0))
    b = asyncio.run(simulated_stamps(make_engine(lagging), lagging, 7.0))
    assert lagging.now - on_time.now > 7.5  # the wall clocks did drift apart
    assert a == b
    # The second request arrives when the first one's last iteration ended, and the stamps
    # add up the model's durations: a prefill, then one step per token.
    assert len(a) == 2 * 41  # per request: its arrival and 40 emissions (batch 1, one token)
    assert a[41] == a[40]
    model = make_engine(on_time).model
    assert a[1] - a[0] == pytest.approx(model.prefill_ms(4) / 1000)


def test_speculative_counters_and_cap() -> None:
    clock = FakeClock()
    spec = SpecSettings("EAGLE3", 2, 1, 3)
    engine = make_engine(clock, spec, cap=2, decode_log_interval=5)

    async def run() -> list[int]:
        engine.start()
        reqs = [
            engine.submit(rid=str(i), prompt_tokens=2, max_new_tokens=50, output_ids=[0] * 50)
            for i in range(3)
        ]
        assert engine.num_waiting == 3
        waits = [asyncio.ensure_future(_drain(engine, r)) for r in reqs]
        await asyncio.sleep(0)
        await asyncio.gather(*waits)
        engine.close()
        return [r.verify_ct for r in reqs]

    verify = asyncio.run(run())
    assert all(v > 0 for v in verify)
    assert engine.stats.spec_forwards == sum(verify)
    assert engine.stats.generated_tokens == 150
    # 1 prefill token per request + all decode tokens
    assert engine.stats.spec_tokens == 150 - 3
    accept = engine.avg_spec_accept_length()
    assert accept is not None and 1.0 < accept < 3.0
    assert engine.flush() and engine.avg_spec_accept_length() is None


async def _drain(engine: Engine, req: object) -> None:
    async for _ in engine.updates(req):  # type: ignore[arg-type]
        pass
