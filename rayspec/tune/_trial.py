"""One trial on one node: a ServerActor brings the candidate's server up, a BenchActor on the
same node measures it over loopback, and the whole process tree is gone before it returns.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayspec._config import BenchApi
from rayspec._config import Engine
from rayspec._config import ExperimentConfig
from rayspec._exceptions import ActorLost
from rayspec._exceptions import ClusterError
from rayspec._exceptions import FailureReason
from rayspec._exceptions import LaunchError
from rayspec._exceptions import NodeLost
from rayspec._exceptions import RayspecError
from rayspec._plural import plural
from rayspec._rayerrors import map_ray_errors
from rayspec._rayerrors import ray_get
from rayspec._rayerrors import ray_kill
from rayspec._rayerrors import ray_message
from rayspec._types import Candidate
from rayspec._types import LaunchSpec
from rayspec._types import RequestRecord
from rayspec._types import RunDecision
from rayspec._types import TrialResult
from rayspec._types import TrialState
from rayspec.bench import BenchActor
from rayspec.bench import BenchPlan
from rayspec.bench import BenchResult
from rayspec.bench import Scenario
from rayspec.bench import category_metrics
from rayspec.bench import dataset_categories
from rayspec.bench import first_failure
from rayspec.bench import slo_metrics
from rayspec.bench import summarize
from rayspec.bench._protocol import RunPlan
from rayspec.bench._protocol import Watch
from rayspec.bench._protocol import extension
from rayspec.bench._protocol import measure
from rayspec.engines import engine_named
from rayspec.server import ServerActor
from rayspec.server import build_launch
from rayspec.server import parse_decode_lines
from rayspec.store import StudyFolder
from rayspec.tune._cluster import NODE_RESOURCE_SHARE
from rayspec.tune._placement import PlacementTimeout
from rayspec.tune._placement import await_placement
from rayspec.tune._placement import waiting_for
from rayspec.tune._site import ACTOR_LOST_DETAIL
from rayspec.tune._site import TrialSite
from rayspec.tune._site import alive_nodes
from rayspec.tune._site import lost_detail
from rayspec.tune._site import node_lost

__all__ = [
    "bench_plan",
    "extension_plan",
    "failed_result",
    "objective_scenario",
    "run_trial",
    "trial_result",
]

_log = logging.getLogger(__name__)

PhaseCallback = Callable[[int, str], None]
# Called with the objective scenario's per-run values so far: go on, measure past the plan,
# or stop (pruned).
RunsCallback = Callable[[int, Sequence[float]], RunDecision]
_POLL_S = 0.5


class _LiveActors:
    """Every actor a running trial holds, so an interrupted driver can stop them at once.

    Killing a ServerActor ends its server tree (the reaper watches the actor's process), and
    the trial's thread, blocked in ``ray.get``, returns with an error instead of finishing.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._actors: dict[int, list[Any]] = {}
        # Set by kill_all (the driver stops): a trial thread that then finds its actors dead
        # knows why, and says nothing of it (Ray's "actor died ... ray.kill" text is noise to
        # a user who pressed Ctrl-C). Cleared when a new trial adds its actors.
        self.stopping = False

    def add(self, trial: int, actor: Any) -> None:
        with self._lock:
            self.stopping = False
            self._actors.setdefault(trial, []).append(actor)

    def drop(self, trial: int) -> None:
        with self._lock:
            self._actors.pop(trial, None)

    def kill_all(self) -> int:
        with self._lock:
            self.stopping = True
            actors = [a for group in self._actors.values() for a in group]
            self._actors.clear()
        for actor in actors:
            ray_kill(actor)
        return len(actors)


LIVE_ACTORS = _LiveActors()


def bench_plan(cfg: ExperimentConfig) -> BenchPlan:
    """The experiment's measurement protocol as the bench package's plan."""
    twin = cfg.server.engine is Engine.twin
    scenarios = tuple(
        Scenario(
            name=sc.name,
            concurrency=sc.concurrency,
            requests_per_run=sc.requests_per_run,
            max_tokens=sc.max_tokens,
            prompt_set=cfg.bench.prompts,
            input_len_range=tuple(sc.input_len) if sc.input_len else None,  # type: ignore[arg-type]
            output_len_range=tuple(sc.output_len) if sc.output_len else None,  # type: ignore[arg-type]
            request_rate=sc.request_rate,
        )
        for sc in cfg.scenarios()
    )
    return BenchPlan(
        scenarios=scenarios,
        warmup=cfg.bench.warmup,
        repeats=cfg.bench.repeats,
        temperature=cfg.bench.temperature,
        # The twin's simulated clock times a twin study at every load (its TTFT, gaps and
        # goodput are the model's, not the host's); a real server is always on the wall clock.
        clock="twin" if twin and cfg.bench.api is BenchApi.generate else "wall",
        # The twin is told each request's prompt category (its acceptance depends on it).
        send_category=twin,
        endpoint=cfg.bench.api.value,
        read_timeout_s=cfg.bench.read_timeout_s,
        request_timeout_s=cfg.bench.request_timeout_s,
    )


def extension_plan(cfg: ExperimentConfig, done: int) -> BenchPlan:
    """More runs of the objective scenario on the same server, after ``done`` measured runs
    (:func:`rayspec.bench._protocol.extension` of the experiment's plan)."""
    return extension(bench_plan(cfg), done, cfg.max_repeats)


def objective_scenario(cfg: ExperimentConfig) -> str:
    return cfg.scenarios()[0].name


def study_categories(cfg: ExperimentConfig) -> tuple[str, ...]:
    """The prompt set's categories when it has several (their figures are stored per trial),
    else none."""
    cats = dataset_categories(cfg.bench.prompts)
    return cats if len(cats) > 1 else ()


def trial_log_path(cfg: ExperimentConfig, number: int) -> str:
    return StudyFolder(os.path.abspath(cfg.out_dir)).log_file(number)


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
    node: str = "",
) -> TrialResult:
    now = time.time()
    return TrialResult(
        trial=number,
        state=TrialState.FAIL,
        value=None,
        candidate=candidate,
        launch=launch,
        metrics={},
        requests=requests,
        start_unix_s=start if start is not None else now,
        end_unix_s=now,
        failure=reason,
        failure_detail=detail,
        log_tail=log_tail,
        node=node,
    )


def run_trial(
    cfg: ExperimentConfig,
    number: int,
    candidate: Candidate,
    *,
    slot: int = 0,
    on_phase: PhaseCallback | None = None,
    on_runs: RunsCallback | None = None,
) -> TrialResult:
    """Run one trial to its end, whatever happens; never raises for a server or bench failure.

    Args:
        cfg: the experiment.
        number: the Optuna trial number (names the actors, the log and the Parquet row).
        candidate: what to launch.
        slot: which concurrent slot runs it (offsets the port).
        on_phase: called with (trial, phase) as the trial moves on.
        on_runs: called after each measured run of the objective scenario; True prunes.
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
    # The trial's GPUs on one node (num_gpus never spans nodes), on a node that declares
    # cluster.node_resource when it is set.
    resource = cfg.cluster.node_resource
    site = TrialSite(  # what a Ray error of the trial means
        alive_at_start=alive_nodes(),  # to name the node if it dies before the trial knows it
        stopping=lambda: LIVE_ACTORS.stopping,
        server_gone=lambda: _actor_gone(server),
    )
    server = ServerActor.options(  # type: ignore[attr-defined]
        num_gpus=cfg.server.tp_size,
        resources={resource: NODE_RESOURCE_SHARE} if resource else None,
        name=f"rayspec-server-trial-{number}",
    ).remote()
    LIVE_ACTORS.add(number, server)
    bench = None
    node_ip = ""
    node_id = ""
    lost = False
    placed = False
    what = waiting_for(cfg.server.tp_size, resource)
    try:
        with map_ray_errors(site.judge, own=(LaunchError,)):
            phase(number, "placing")
            node_ip = await_placement(
                server.node_ip.remote(), what=what, timeout_s=cfg.cluster.placement_timeout_s,
                note=lambda line: phase(number, line),
            )  # fmt: skip
            placed = True
            node_id = ray.get(server.node_id.remote())
            node_ip = f"{node_ip} {node_id[:12]}"  # several nodes may share an address
            site.node_id, site.node = node_id, node_ip
            # The client on the server's node: its load stays on loopback.
            strategy = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
            bench = BenchActor.options(
                name=f"rayspec-bench-trial-{number}", scheduling_strategy=strategy
            ).remote()
            LIVE_ACTORS.add(number, bench)
            phase(number, "starting server")
            ray.get(server.start.remote(launch))
            phase(number, "waiting for ready")
            info = ray.get(server.wait_ready.remote())
            phase(number, "benchmarking")
            bench_result, pruned = _run_bench(bench, launch, cfg, number, on_runs, phase)
            view = _server_view(bench, server, launch, speculative=candidate.spec is not None)
            failure = first_failure(bench_result.records)
            if failure is not None:
                reason, text = failure
                if reason is not FailureReason.STALLED_STREAM and not _alive(server):
                    lost = node_lost(node_id)  # its state now: no wait for a plain crash
                    reason = FailureReason.NODE_LOST if lost else _death_reason(server)
                    if lost:
                        text = lost_detail(node_ip, "while it was measured") + f"; {text}"
                    elif _actor_gone(server) and not LIVE_ACTORS.stopping:
                        reason = FailureReason.ACTOR_LOST
                        text = f"{ACTOR_LOST_DETAIL}; {text}"
                return failed_result(
                    number, candidate, reason, f"a request failed: {text}"[:2000], launch=launch,
                    start=start, log_tail=_log_tail(server, launch),
                    requests=tuple(bench_result.records), node=node_ip,
                )  # fmt: skip
            return trial_result(
                cfg, number, candidate, launch, bench_result, pruned=pruned, info=info, view=view,
                start=start, node=node_ip,
            )  # fmt: skip
    except PlacementTimeout as exc:
        return failed_result(
            number, candidate, FailureReason.NO_PLACEMENT,
            f"no node had {what} free within {exc.waited_s:.0f} s "
            "(cluster.placement_timeout_s): held by a job outside the study? No server was "
            "started; the configuration is queued again for a resume", start=start,
        )  # fmt: skip
    except LaunchError as exc:
        return failed_result(
            number, candidate, exc.reason, ray_message(exc), launch=launch, start=start,
            log_tail=exc.log_tail or _log_tail(server, launch), node=node_ip,
        )  # fmt: skip
    except ClusterError as exc:  # judged by the site: node_lost, actor_lost or unknown
        lost = isinstance(exc, NodeLost)
        return failed_result(
            number, candidate, exc.reason, str(exc)[:2000], launch=launch, start=start,
            log_tail=_log_tail(server, launch), node=exc.node or node_ip,
        )  # fmt: skip
    finally:
        if placed:
            phase(number, "stopping server")
            _stop(server, cfg.server.stop_timeout_s, quiet=lost)
        else:  # never placed (or lost while being placed): nothing to stop, only the request
            ray.kill(server)
        if bench is not None:
            ray.kill(bench)
        LIVE_ACTORS.drop(number)


def _on_actor(bench: Any, launch: LaunchSpec, scenario: str) -> RunPlan:
    """The protocol's ``run`` for a real trial: the plan on the bench actor, its progress
    polled so the watch sees each finished run of ``scenario`` (a stop ends the plan there)."""

    def run(plan: BenchPlan, watch: Watch | None) -> BenchResult:
        ref = bench.run_detailed.remote(launch.base_url, plan)
        seen = 0
        stopping = False
        while True:
            done, _ = ray.wait([ref], timeout=_POLL_S)
            if watch is not None and not stopping:
                reports = ray.get(bench.progress.remote())
                runs = [r.tok_s for r in reports if r.scenario == scenario and r.run >= 0]
                if len(runs) > seen:
                    seen = len(runs)
                    if watch(runs):
                        stopping = True
                        bench.request_stop.remote()
            if done:
                break
        result: BenchResult = ray.get(ref)
        return result

    return run


def _run_bench(
    bench: Any,
    launch: LaunchSpec,
    cfg: ExperimentConfig,
    number: int,
    on_runs: RunsCallback | None,
    phase: PhaseCallback,
) -> tuple[BenchResult, bool]:
    """Run the plan, watching each finished run so a hopeless trial stops early and a close
    one measures past the plan (``bench.max_repeats``). Returns the result and "pruned"."""
    return measure(
        bench_plan(cfg),
        _on_actor(bench, launch, objective_scenario(cfg)),
        max_repeats=cfg.max_repeats,
        decide=None if on_runs is None else (lambda values: on_runs(number, values)),
        on_extend=lambda n: phase(number, f"close to the best: up to {n} more runs"),
    )


def _server_view(
    bench: Any, server: Any, launch: LaunchSpec, *, speculative: bool
) -> dict[str, float]:
    """The server's own view, beside the client's: /server_info, /metrics, decode lines."""
    out: dict[str, float] = {}
    try:
        view = ray_get(bench.server_view.remote(launch.base_url), timeout_s=30)
    except RayspecError:  # any failed call: the view is a nicety
        view = {}
    for key, name in (
        ("avg_spec_accept_length", "server_accept_length"),
        ("last_gen_throughput", "server_gen_throughput"),
    ):
        value = view.get(key)
        if isinstance(value, int | float):
            out[name] = float(value)
    metrics = view.get("metrics") or {}
    keys = engine_named(launch.engine).metrics
    accept = metrics.get(keys.accept_length)
    # The gauge of the last decode-log window: 0 without speculation, and 0 with it until a
    # window has completed since the flush (a short run at high acceptance has none). An
    # accept length is at least 1, so 0 is "none", not a value.
    if speculative and isinstance(accept, int | float) and accept > 0:
        out["metrics_spec_accept_length"] = float(accept)
    gen = metrics.get(keys.gen_throughput)
    # A gauge of the last decode-log window that SGLang sets to 0 at every prefill-stats tick
    # and 30 s after the last decode window: after a run, 0 means "no window", not 0 tok/s.
    if isinstance(gen, int | float) and gen > 0:
        out["metrics_gen_throughput"] = float(gen)
    lines = parse_decode_lines(_log_tail(server, launch, 4000))
    accepts = [b.accept_len for b in lines if b.accept_len is not None]
    gens = [b.gen_throughput_tok_s for b in lines if b.gen_throughput_tok_s]
    if accepts:
        out["log_accept_len_mean"] = float(sum(accepts) / len(accepts))
    if gens:
        out["log_gen_throughput_mean"] = float(sum(gens) / len(gens))
    return out


def trial_result(
    cfg: ExperimentConfig,
    number: int,
    candidate: Candidate,
    launch: LaunchSpec,
    bench: BenchResult,
    *,
    pruned: bool,
    info: dict[str, Any],
    view: dict[str, float],
    start: float,
    node: str,
) -> TrialResult:
    """A measured trial's result (no request failed): metrics per scenario, the objective,
    and what pruning saved. Shared by the real trial and the simulated one."""
    records = tuple(bench.records)
    scenarios = [sc.name for sc in cfg.scenarios()]
    metrics = dict(summarize(records, scenario=scenarios[0]))
    metrics.update(_slo_view(cfg, records, scenarios[0]))
    for name in scenarios[1:]:
        for key, value in summarize(records, scenario=name).items():
            metrics[f"{name}__{key}"] = value
        for key, value in _slo_view(cfg, records, name).items():
            metrics[f"{name}__{key}"] = value
    metrics.update(view)
    if study_categories(cfg):  # the objective scenario's figures per prompt category
        metrics.update(category_metrics(records, scenario=scenarios[0]))
    measured = [r for r in bench.runs if r.run >= 0]
    planned = cfg.bench.repeats * len(scenarios)
    pruned = pruned and len(measured) < planned  # a stop after the last run saves nothing
    metrics["bench_s"] = float(sum(r.wall_s for r in bench.runs))
    metrics["runs"] = float(sum(1 for r in measured if r.scenario == scenarios[0]))
    metrics.update(bench.client_metrics())  # client CPU share: is it measuring itself?
    if pruned and measured:
        mean_wall = sum(r.wall_s for r in measured) / len(measured)
        metrics["bench_s_saved"] = float((planned - len(measured)) * mean_wall)
    else:
        metrics["bench_s_saved"] = 0.0
    objective = metrics.get(cfg.study.objective)
    if objective is None or not math.isfinite(objective):
        return failed_result(
            number, candidate, FailureReason.UNKNOWN, "no throughput could be computed",
            launch=launch, start=start, requests=records, node=node,
        )  # fmt: skip
    return TrialResult(
        trial=number,
        state=TrialState.PRUNED if pruned else TrialState.COMPLETE,
        value=None if pruned else float(objective),
        candidate=candidate,
        launch=launch,
        metrics=metrics,
        requests=records,
        start_unix_s=start,
        end_unix_s=time.time(),
        failure_detail=(
            f"pruned after {len(measured)} of {plural(planned, 'run')}: cannot beat the incumbent"
            if pruned
            else ""
        ),
        server_info=json.dumps(info, default=str)[:20000],
        node=node,
    )


def _slo_view(
    cfg: ExperimentConfig, records: Sequence[RequestRecord], scenario: str
) -> dict[str, float]:
    """The per-user decode rate (the report's Pareto table); with ``study.slo``, goodput and
    the SLO's p99s and violation too (bench/_slo.py)."""
    out = slo_metrics(records, cfg.study.slo, scenario=scenario)
    return out if cfg.study.slo else {"user_tok_s_mean": out["user_tok_s_mean"]}


def _death_reason(server: Any) -> FailureReason:
    """Why a server that died while serving died, from its log (e.g. OOM, an invalid tree)."""
    try:
        ray_get(server.raise_if_dead.remote(), timeout_s=10)
    except LaunchError as exc:
        if exc.reason not in (FailureReason.UNKNOWN, FailureReason.STARTUP_CRASH):
            return exc.reason
    except RayspecError:
        pass
    return FailureReason.CRASH_MID_BENCHMARK


def _actor_gone(server: Any) -> bool:
    """Whether the server's actor no longer answers because it died (not merely its server)."""
    if server is None:
        return False
    try:
        ray_get(server.alive.remote(), timeout_s=10)
    except ActorLost:
        return True
    except RayspecError:
        pass
    return False


def _alive(server: Any) -> bool:
    try:
        return bool(ray_get(server.alive.remote(), timeout_s=10))
    except RayspecError:
        return False


def _log_tail(server: Any, launch: LaunchSpec, lines: int = 40) -> str:
    """The server log's last lines: from the actor, or from the file when the actor is gone
    and the log is on this machine (a local cluster)."""
    try:
        return str(ray_get(server.log_tail.remote(lines), timeout_s=10))
    except RayspecError:
        pass
    try:
        with open(launch.log_path, encoding="utf-8", errors="replace") as fh:
            return "".join(fh.readlines()[-lines:])
    except OSError:
        return ""


def _stop(server: Any, timeout_s: float, *, quiet: bool = False) -> None:
    try:
        ray_get(server.stop.remote(), timeout_s=timeout_s + 10)
    except RayspecError as exc:
        if LIVE_ACTORS.stopping or quiet:  # the driver killed it, or its node died
            _log.debug("server actor already stopped by the driver: %s", exc)
        else:
            first = ray_message(exc).strip().splitlines()
            _log.warning(
                "server stop did not confirm (%s); killing the actor",
                first[0] if first else type(exc).__name__,
            )
    finally:
        ray.kill(server)
