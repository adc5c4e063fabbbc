"""The study's Ray metrics: what the Ray dashboard's metrics view and Prometheus show.

Created lazily in the driver process, on the first finished trial once Ray is connected; the
driver updates them with one call per finished trial (:meth:`StudyMetrics.trial_done`). Where
Ray's metrics are unavailable (Ray not connected, as in the simulated studies; no metrics
agent), every call is a no-op: metrics never fail a study.

Every metric carries the tag ``study`` (Prometheus adds Ray's ``ray_`` prefix to the names):

========================================  =====================================================
``rayspec_trials_total{state}``           counter: finished trials by state (COMPLETE, PRUNED,
                                          FAIL)
``rayspec_failures_total{reason}``        counter: failed trials by reason (``FailureReason``)
``rayspec_restarts``                      gauge: server launches used so far
``rayspec_restart_budget``                gauge: ``study.max_restarts``
``rayspec_trial_tok_s{trial}``            gauge: each measured trial's tok/s (output tokens/s)
``rayspec_trial_accept_length{trial}``    gauge: each measured trial's accept length
``rayspec_best_tok_s``                    gauge: the best measured trial's tok/s so far
========================================  =====================================================
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from types import ModuleType
from typing import Any

from rayspec._types import TrialRecord
from rayspec._types import TrialResult
from rayspec._types import TrialState

__all__ = ["StudyMetrics", "record_exporter"]

_log = logging.getLogger(__name__)


class StudyMetrics:
    """The study's metrics; safe to call whether or not Ray's metrics work.

    Example::

        metrics = StudyMetrics("eagle3-twin", budget=14, records=store.load_records(read))
        metrics.trial_done(result, restarts=3)

    Args:
        study: the study name (the ``study`` tag).
        budget: ``study.max_restarts``.
        records: the stored trials of a resumed study (the best so far starts from them).
        module: the metrics module (``ray.util.metrics`` when None; tests pass a fake).
    """

    def __init__(
        self,
        study: str,
        budget: int,
        records: Iterable[TrialRecord] = (),
        module: ModuleType | None = None,
    ) -> None:
        self.study = study
        self.budget = budget
        self.best_tok_s = max(
            (r.result.value for r in records
             if r.result.state is TrialState.COMPLETE and r.result.value is not None
             and not r.reused),
            default=math.nan,
        )  # fmt: skip
        self._module = module
        self._metrics: dict[str, Any] | None = None
        self._disabled = False

    def _create(self) -> dict[str, Any] | None:
        """The Ray metric objects, created on first use (None: unavailable, never retried)."""
        if self._metrics is not None or self._disabled:
            return self._metrics
        try:
            module: Any = self._module
            if module is None:
                import ray

                if not ray.is_initialized():
                    self._disabled = True
                    return None
                import ray.util.metrics

                module = ray.util.metrics
            study = ("study",)
            self._metrics = {
                "trials": module.Counter(
                    "rayspec_trials_total", description="Finished trials by state.",
                    tag_keys=study + ("state",)),
                "failures": module.Counter(
                    "rayspec_failures_total", description="Failed trials by failure reason.",
                    tag_keys=study + ("reason",)),
                "restarts": module.Gauge(
                    "rayspec_restarts", description="Server launches used so far.",
                    tag_keys=study),
                "budget": module.Gauge(
                    "rayspec_restart_budget", description="The study's restart budget.",
                    tag_keys=study),
                "tok_s": module.Gauge(
                    "rayspec_trial_tok_s", description="A measured trial's output tok/s.",
                    tag_keys=study + ("trial",)),
                "accept": module.Gauge(
                    "rayspec_trial_accept_length",
                    description="A measured trial's accept length (tokens per verify step).",
                    tag_keys=study + ("trial",)),
                "best": module.Gauge(
                    "rayspec_best_tok_s",
                    description="The best measured trial's output tok/s so far.",
                    tag_keys=study),
            }  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - metrics are optional, never the study's failure
            _log.warning("Ray metrics unavailable (%s: %s): not exported", type(exc).__name__, exc)
            self._disabled = True
            return None
        return self._metrics

    def trial_done(self, result: TrialResult, restarts: int) -> None:
        """Count a finished trial and export its numbers (no-op without Ray's metrics)."""
        if result.state is TrialState.COMPLETE and result.value is not None:
            value = float(result.value)
            if math.isfinite(value) and not value <= self.best_tok_s:
                self.best_tok_s = value
        m = self._create()
        if m is None:
            return
        tags = {"study": self.study}
        trial = {**tags, "trial": str(result.trial)}
        try:
            m["trials"].inc(1.0, tags={**tags, "state": result.state.value})
            if result.state is TrialState.FAIL:
                m["failures"].inc(1.0, tags={**tags, "reason": result.failure or "unknown"})
            m["restarts"].set(float(restarts), tags=tags)
            m["budget"].set(float(self.budget), tags=tags)
            tok_s = result.metrics.get("tok_s_mean", math.nan)
            if result.state is not TrialState.FAIL and math.isfinite(tok_s):
                m["tok_s"].set(float(tok_s), tags=trial)
            accept = result.metrics.get("accept_length", math.nan)
            if math.isfinite(accept):
                m["accept"].set(float(accept), tags=trial)
            if math.isfinite(self.best_tok_s):
                m["best"].set(self.best_tok_s, tags=tags)
        except Exception as exc:  # noqa: BLE001 - as above
            _log.warning("Ray metrics update failed (%s: %s): no longer exported",
                         type(exc).__name__, exc)  # fmt: skip
            self._metrics, self._disabled = None, True


def record_exporter(out_dir: str, study: str) -> str | None:
    """Write where the driver node exports this study's metrics into the study folder, for
    ``python -m rayspec.metrics`` (the driver's metrics are exported by its own node). Returns
    the file's path; None where Ray does not say (never the study's failure)."""
    from rayspec.metrics import write_exporter_file

    try:
        import ray

        if not ray.is_initialized():
            return None
        ctx = ray.get_runtime_context()
        node_id = ctx.get_node_id()
        for node in ray.nodes():  # type: ignore[no-untyped-call]
            if node.get("NodeID") == node_id and node.get("MetricsExportPort"):
                address = f"{node['NodeManagerAddress']}:{int(node['MetricsExportPort'])}"
                return write_exporter_file(out_dir, study, address, ctx.get_session_name())
    except Exception as exc:  # noqa: BLE001 - metrics are optional, never the study's failure
        _log.warning("Ray metrics exporter not recorded (%s: %s)", type(exc).__name__, exc)
    return None
