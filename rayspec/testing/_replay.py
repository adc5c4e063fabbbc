"""A trial function that replays a recorded landscape: a real engine's starts, served again.

:class:`ReplayedTrials` is a drop-in ``trial_fn`` for :func:`rayspec.tune.run_study`, like
:class:`~rayspec.testing.SimulatedTrials`, but its truth is not a model: it is what a real engine
measured (a landscape, :func:`rayspec.store.read_landscape`: every request of several server
starts of every setting of a space). A trial of setting x draws one of x's recorded starts and
serves that start's requests through the one protocol loop a real trial runs
(:func:`rayspec.bench._protocol.measure`: warm-up first, then the runs in their recorded order,
with the driver's prune / extend answers after each run); asked for more runs than the start
recorded, it resamples the start's own runs. The records are real ``RequestRecord``s: the
recorded timings, accept histograms and greedy output ids (so the correctness gate runs on
them). The result goes through the same builder as a real trial's.

The start is drawn from the study seed and the trial number, among the setting's starts this
replay has not served yet (all again once each has been served): a real node never gives a
second start that is the first one again, and two identical starts would read as no noise
between starts. Runs beyond a start's recorded ones are drawn from its measured runs (seeded
the same way); their output ids are the setting's recorded ones for that run number, or none
when no start of it recorded that run (the gate then does not compare them).

A setting the landscape lacks is not silently something else: its trial fails ``infeasible``
(no server started, no restart spent) and says which file lacks which setting.

Example::

    replay = ReplayedTrials("benchmarks/landscapes/cpu-d0.parquet")
    run_study(cfg, trial_fn=replay, printer=lambda _line: None)
    replay.truth(best.candidate)     # its mean tok/s over every recorded start's runs
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass

from rayspec._config import ExperimentConfig
from rayspec._exceptions import ConfigError
from rayspec._exceptions import FailureReason
from rayspec._types import Candidate
from rayspec._types import RequestRecord
from rayspec._types import TrialResult
from rayspec.bench import BenchPlan
from rayspec.bench import BenchResult
from rayspec.bench import RunReport
from rayspec.bench import run_tok_s
from rayspec.bench._protocol import Watch
from rayspec.bench._protocol import measure
from rayspec.server import build_launch
from rayspec.store import Landscape
from rayspec.store import LandscapeRow
from rayspec.store import read_landscape
from rayspec.tune._trial import PhaseCallback
from rayspec.tune._trial import RunsCallback
from rayspec.tune._trial import bench_plan
from rayspec.tune._trial import failed_result
from rayspec.tune._trial import trial_result

__all__ = ["RecordedStart", "ReplayedTrials"]


@dataclass(frozen=True)
class RecordedStart:
    """One recorded server start of a setting: its runs by number (-1: the warm-up)."""

    start: int
    runs: Mapping[int, tuple[LandscapeRow, ...]]  # each run's requests, by index
    startup_s: float

    @property
    def measured(self) -> tuple[int, ...]:
        """The measured run numbers, in order (the warm-up left out)."""
        return tuple(sorted(r for r in self.runs if r >= 0))

    def run_tok_s(self, run: int) -> float:
        """A run's recorded throughput (the ``tok_s`` of its requests)."""
        return self.runs[run][0].tok_s


class ReplayedTrials:
    """A ``trial_fn`` whose trials replay a landscape's recorded server starts.

    Args:
        path: a landscape file (one drafter's, :func:`rayspec.store.read_landscape`).
        drafter: which drafter's rows, when the file holds several.

    Attributes:
        landscape: the file as read.
        launches: trials that replayed a start, in order.
        served: (trial, setting label, start) per replayed trial, in order.

    Raises:
        StoreError: the file cannot be read or is not a landscape.
        ConfigError: the file holds several drafters and ``drafter`` names none of them.
    """

    def __init__(self, path: str, *, drafter: str | None = None) -> None:
        self.landscape: Landscape = read_landscape(path)
        names = self.landscape.drafters
        if drafter is None and len(names) > 1:
            raise ConfigError(f"landscape {path} holds drafters {', '.join(names)}: name one")
        if drafter is not None and drafter not in names:
            raise ConfigError(f"landscape {path} has no drafter {drafter!r} ({', '.join(names)})")
        self.drafter = drafter if drafter is not None else (names[0] if names else "")
        self._starts = _index(self.landscape, self.drafter)
        self.launches: list[int] = []
        self.served: list[tuple[int, str, int]] = []

    @property
    def settings(self) -> tuple[str, ...]:
        """The recorded settings (their ``Candidate.label()``), in file order."""
        return tuple(self._starts)

    def starts(self, setting: Candidate | str) -> tuple[RecordedStart, ...]:
        """A setting's recorded starts (empty when the landscape lacks it)."""
        return self._starts.get(_label(setting), ())

    def truth(self, setting: Candidate | str) -> float:
        """A setting's true throughput: the mean tok/s of every measured run of every start
        recorded for it.

        Raises:
            KeyError: the landscape lacks the setting.
        """
        starts = self._starts.get(_label(setting))
        if not starts:
            raise KeyError(f"{_label(setting)!r} is not in landscape {self.landscape.path}")
        return statistics.mean(s.run_tok_s(r) for s in starts for r in s.measured)

    def __call__(
        self,
        cfg: ExperimentConfig,
        number: int,
        candidate: Candidate,
        *,
        slot: int = 0,
        on_phase: PhaseCallback | None = None,
        on_runs: RunsCallback | None = None,
    ) -> TrialResult:
        plan = bench_plan(cfg)
        objective = plan.scenarios[0]
        if len(plan.scenarios) > 1 or objective.concurrency != 1:
            raise ConfigError(
                "bench.scenarios: a replayed landscape holds one scenario at concurrency 1; "
                f"this experiment asks for {len(plan.scenarios)} (first at concurrency "
                f"{objective.concurrency})"
            )
        start = time.time()
        label = candidate.label()
        starts = self._starts.get(label)
        if not starts:
            return failed_result(
                number, candidate, FailureReason.INFEASIBLE,
                f"{label} is not in the recorded landscape {self.landscape.path} "
                f"({len(self._starts)} settings of drafter {self.drafter!r}): nothing to "
                "replay, so it was not launched", start=start, node="replayed",
            )  # fmt: skip
        rng = random.Random((cfg.study.seed or 0) * 1_000_003 + number)
        done = {s for t, lab, s in self.served if lab == label}
        fresh = [s for s in starts if s.start not in done] or list(starts)
        chosen = fresh[rng.randrange(len(fresh))]
        self.launches.append(number)
        self.served.append((number, label, chosen.start))
        if on_phase is not None:
            on_phase(number, f"starting server (replayed: start {chosen.start} of {label})")
        launch = build_launch(
            cfg, candidate, port=cfg.server.port + slot, log_path=os.devnull, trial=number
        )
        resample = random.Random(rng.random())
        measured = chosen.measured
        by_run = _outputs_by_run(starts)

        def served_run(run: int) -> tuple[RequestRecord, ...]:
            if run in chosen.runs:
                rows, ids = chosen.runs[run], None
            else:  # past the recorded runs: one of the start's own, again
                rows = chosen.runs[measured[resample.randrange(len(measured))]]
                ids = by_run.get(run, {})
            return tuple(
                _record(row, objective.name, run, row.output_ids if ids is None else ids.get(i))
                for i, row in enumerate(rows)
            )

        def run_plan(part: BenchPlan, watch: Watch | None) -> BenchResult:
            reports: list[RunReport] = []
            values: list[float] = []
            if part.warmup and -1 in chosen.runs:
                reports.append(_report(objective.name, -1, served_run(-1)))
            stopped = ""
            for run in range(part.first_run, part.first_run + part.repeats):
                reports.append(_report(objective.name, run, served_run(run)))
                values.append(reports[-1].tok_s)
                if watch is not None and watch(values):
                    stopped = "callback"
                    break
            records = tuple(r for rep in reports for r in rep.records)
            return BenchResult(records=records, runs=tuple(reports), stopped=stopped)

        decide = None if on_runs is None else (lambda values: on_runs(number, list(values)))
        bench, pruned = measure(plan, run_plan, max_repeats=cfg.max_repeats, decide=decide)
        info = {
            "engine": f"replayed landscape {os.path.basename(self.landscape.path)}",
            "drafter": self.drafter,
            "start": chosen.start,
            "startup_s": chosen.startup_s,
        }
        return trial_result(
            cfg, number, candidate, launch, bench, pruned=pruned, info=info, view={},
            start=start, node="replayed",
        )  # fmt: skip


def _label(setting: Candidate | str) -> str:
    return setting if isinstance(setting, str) else setting.label()


def _index(land: Landscape, drafter: str) -> dict[str, tuple[RecordedStart, ...]]:
    """setting -> its recorded starts (by start number), each start's runs by number."""
    grouped: dict[str, dict[int, dict[int, list[LandscapeRow]]]] = {}
    for row in land.rows:
        if row.drafter == drafter:
            runs = grouped.setdefault(row.setting, {}).setdefault(row.start, {})
            runs.setdefault(row.run, []).append(row)
    out: dict[str, tuple[RecordedStart, ...]] = {}
    for setting, starts in grouped.items():
        kept = []
        for number, runs in sorted(starts.items()):
            ordered = {r: tuple(sorted(rows, key=lambda x: x.index)) for r, rows in runs.items()}
            if any(r >= 0 for r in ordered):  # a start without a measured run serves nothing
                first = next(iter(ordered.values()))[0]
                kept.append(RecordedStart(number, ordered, first.startup_s))
        if kept:
            out[setting] = tuple(kept)
    return out


def _outputs_by_run(starts: tuple[RecordedStart, ...]) -> dict[int, dict[int, tuple[int, ...]]]:
    """Run number -> request index -> the setting's recorded greedy output for it."""
    out: dict[int, dict[int, tuple[int, ...]]] = {}
    for s in starts:
        for run, rows in s.runs.items():
            for row in rows:
                out.setdefault(run, {}).setdefault(row.index, row.output_ids)
    return out


def _record(
    row: LandscapeRow, scenario: str, run: int, output_ids: tuple[int, ...] | None
) -> RequestRecord:
    return RequestRecord(
        scenario=scenario, run=run, index=row.index, concurrency=1,
        prompt_tokens=row.prompt_tokens, completion_tokens=row.completion_tokens,
        ttft_ms=row.ttft_ms, e2e_ms=row.e2e_ms, itl_ms=row.itl_ms,
        start_unix_s=row.started_unix_s, spec_verify_ct=row.spec_verify_ct,
        accept_length=row.accept_length, output_ids=output_ids or None,
        accept_histogram=row.accept_histogram,
    )  # fmt: skip


def _report(scenario: str, run: int, records: tuple[RequestRecord, ...]) -> RunReport:
    """A run as the client saw it: its requests one after another; its throughput as the
    trial's metrics compute it (the recorded ``tok_s`` is that figure of the same requests)."""
    wall = sum(r.e2e_ms for r in records) / 1000.0
    return RunReport(scenario, run, records, wall, 0.0, run_tok_s(records))
