"""One trial on one node: a ServerActor brings the candidate's server up, a BenchActor on the
same node measures it over loopback, and the whole process tree is gone before it returns.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayspec._config import ExperimentConfig
from rayspec._exceptions import BenchError
from rayspec._exceptions import FailureReason
from rayspec._exceptions import LaunchError
from rayspec._types import Candidate
from rayspec._types import LaunchSpec
from rayspec._types import RequestRecord
from rayspec._types import TrialResult
from rayspec.bench import BenchActor
from rayspec.bench import BenchPlan
from rayspec.bench import Scenario
from rayspec.bench import summarize
from rayspec.server import ServerActor
from rayspec.server._command import build_launch

__all__ = ["bench_plan", "failed_result", "run_trial"]

_log = logging.getLogger(__name__)

PhaseCallback = Callable[[int, str], None]


def bench_plan(cfg: ExperimentConfig) -> BenchPlan:
    """The experiment's measurement protocol as the bench package's plan."""
    scenarios = tuple(
        Scenario(
            name=sc.name,
            concurrency=sc.concurrency,
            requests_per_run=sc.requests_per_run,
            max_tokens=sc.max_tokens,
            prompt_set=cfg.bench.prompts,
        )
        for sc in cfg.scenarios()
    )
    return BenchPlan(
        scenarios=scenarios,
        warmup=cfg.bench.warmup,
        repeats=cfg.bench.repeats,
        temperature=cfg.bench.temperature,
        read_timeout_s=cfg.bench.read_timeout_s,
        request_timeout_s=cfg.bench.request_timeout_s,
    )


def trial_log_path(cfg: ExperimentConfig, number: int) -> str:
    return os.path.join(os.path.abspath(cfg.out_dir), "logs", f"trial-{number:06d}.log")


def failed_result(
    number: int,
    candidate: Candidate,
    reason: FailureReason,
    detail: str,
    *,
    launch: LaunchSpec | None = None,
    start: float | None = None,
    log_tail: str = "",
    requests: tuple[RequestRecord, ...] = (),
) -> TrialResult:
    now = time.time()
    return TrialResult(
        trial=number,
        state="FAIL",
        value=None,
        candidate=candidate,
        launch=launch,
        metrics={},
        requests=requests,
        start_unix_s=start if start is not None else now,
        end_unix_s=now,
        failure=reason.value,
        failure_detail=detail,
        log_tail=log_tail,
    )


def _node_id_of_ip(ip: str) -> str | None:
    for node in ray.nodes():
        if node.get("Alive") and node.get("NodeManagerAddress") == ip:
            return str(node["NodeID"])
    return None


def _objective(metrics: dict[str, float]) -> float | None:
    value = metrics.get("tok_s_mean")
    if value is None or not math.isfinite(value):
        return None
    return float(value)


def run_trial(
    cfg: ExperimentConfig,
    number: int,
    candidate: Candidate,
    *,
    slot: int = 0,
    on_phase: PhaseCallback | None = None,
) -> TrialResult:
    """Run one trial to its end, whatever happens; never raises for a server or bench failure.

    Args:
        cfg: the experiment.
        number: the Optuna trial number (names the actors, the log and the Parquet row).
        candidate: what to launch.
        slot: which concurrent slot runs it (offsets the port).
        on_phase: called with (trial, phase) as the trial moves on.
    """
    phase = on_phase or (lambda _n, _p: None)
    start = time.time()
    launch = build_launch(
        cfg,
        candidate,
        port=cfg.server.port + slot,
        log_path=trial_log_path(cfg, number),
        trial=number,
    )
    os.makedirs(os.path.dirname(launch.log_path), exist_ok=True)
    server = ServerActor.options(  # type: ignore[attr-defined]
        num_gpus=cfg.server.tp_size,
        name=f"rayspec-server-trial-{number}",
    ).remote()
    bench = None
    node_ip = ""
    try:
        phase(number, "placing")
        node_ip = ray.get(server.node_ip.remote())
        node_id = _node_id_of_ip(node_ip)
        strategy = (
            NodeAffinitySchedulingStrategy(node_id=node_id, soft=False) if node_id else "DEFAULT"
        )
        bench = BenchActor.options(  # type: ignore[attr-defined]
            name=f"rayspec-bench-trial-{number}", scheduling_strategy=strategy
        ).remote()
        phase(number, "starting server")
        ray.get(server.start.remote(launch))
        phase(number, "waiting for ready")
        info = ray.get(server.wait_ready.remote())
        phase(number, "benchmarking")
        records = _run_bench(bench, server, launch, cfg)
        return _measured_result(number, candidate, launch, records, info, start, node_ip, server)
    except LaunchError as exc:
        return failed_result(
            number,
            candidate,
            exc.reason,
            str(exc),
            launch=launch,
            start=start,
            log_tail=exc.log_tail or _log_tail(server),
        )
    except ray.exceptions.RayActorError as exc:
        return failed_result(
            number, candidate, FailureReason.UNKNOWN, f"actor died: {exc}", launch=launch,
            start=start, log_tail=_log_tail(server),
        )  # fmt: skip
    finally:
        phase(number, "stopping server")
        _stop(server, cfg.server.stop_timeout_s)
        if bench is not None:
            ray.kill(bench)


def _run_bench(
    bench: ray.actor.ActorHandle,
    server: ray.actor.ActorHandle,
    launch: LaunchSpec,
    cfg: ExperimentConfig,
) -> tuple[RequestRecord, ...]:
    try:
        records = ray.get(bench.run.remote(launch.base_url, bench_plan(cfg)))
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if isinstance(getattr(exc, "cause", None), BenchError) else None
        if cause is not None:
            raise _bench_failure(cause, server) from exc
        raise
    return tuple(records)


def _bench_failure(exc: BenchError, server: ray.actor.ActorHandle) -> LaunchError:
    alive = _alive(server)
    reason = exc.reason
    if not alive and reason is not FailureReason.STALLED_STREAM:
        reason = FailureReason.CRASH_MID_BENCHMARK
    return LaunchError(str(exc), reason=reason, log_tail=_log_tail(server))


def _measured_result(
    number: int,
    candidate: Candidate,
    launch: LaunchSpec,
    records: tuple[RequestRecord, ...],
    info: dict[str, object],
    start: float,
    node_ip: str,
    server: ray.actor.ActorHandle,
) -> TrialResult:
    measured = [r for r in records if r.run >= 0]
    failed = [r for r in measured if not r.ok]
    if failed or not measured:
        # A request that failed mid-run: the server crashed or a stream stalled.
        first = failed[0].error if failed else "no request was measured"
        alive = _alive(server)
        stalled = any("stall" in (r.error or "").lower() for r in failed)
        if stalled:
            reason = FailureReason.STALLED_STREAM
        elif not alive:
            reason = FailureReason.CRASH_MID_BENCHMARK
        else:
            reason = FailureReason.UNKNOWN
        return failed_result(
            number, candidate, reason, f"{len(failed)} request(s) failed: {first}",
            launch=launch, start=start, log_tail=_log_tail(server), requests=records,
        )  # fmt: skip
    first_scenario = measured[0].scenario
    metrics = dict(summarize(list(records), scenario=first_scenario))
    metrics.setdefault("tok_s_peak", metrics.get("tok_s_max", math.nan))
    value = _objective(metrics)
    if value is None:
        return failed_result(
            number, candidate, FailureReason.UNKNOWN, "no throughput could be computed",
            launch=launch, start=start, requests=records,
        )  # fmt: skip
    return TrialResult(
        trial=number,
        state="COMPLETE",
        value=value,
        candidate=candidate,
        launch=launch,
        metrics=metrics,
        requests=records,
        start_unix_s=start,
        end_unix_s=time.time(),
        server_info=json.dumps(info, default=str)[:20000],
        node=node_ip,
    )


def _alive(server: ray.actor.ActorHandle) -> bool:
    try:
        return bool(ray.get(server.alive.remote(), timeout=10))
    except (ray.exceptions.RayError, TimeoutError):
        return False


def _log_tail(server: ray.actor.ActorHandle) -> str:
    try:
        return str(ray.get(server.log_tail.remote(40), timeout=10))
    except (ray.exceptions.RayError, TimeoutError):
        return ""


def _stop(server: ray.actor.ActorHandle, timeout_s: float) -> None:
    try:
        ray.get(server.stop.remote(), timeout=timeout_s + 10)
    except (ray.exceptions.RayError, TimeoutError) as exc:
        _log.warning("server stop did not confirm (%s); killing the actor", exc)
    finally:
        ray.kill(server)
