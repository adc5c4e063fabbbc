"""Decisions after each run of a running trial: its running mean goes to Optuna, and a trial
that cannot beat the incumbent is pruned, one close to the best measures more runs.

Called from the trial threads while the main thread starts and records trials.
"""

from __future__ import annotations

from collections.abc import Sequence

from rayspec._config import ExperimentConfig
from rayspec._types import RunDecision
from rayspec.search import Evidence
from rayspec.search import TrialHandle
from rayspec.search import wants_more_runs
from rayspec.tune._decide import cannot_beat
from rayspec.tune._ledger import Ledger
from rayspec.tune._progress import PlainProgress

__all__ = ["RunJudge"]


class RunJudge:
    """Judges each run of the trials running now (``on_runs`` is the trial function's hook)."""

    def __init__(self, cfg: ExperimentConfig, ledger: Ledger, sink: PlainProgress) -> None:
        self.cfg = cfg
        self.ledger = ledger
        self.sink = sink
        self._live: dict[int, TrialHandle] = {}  # trial number -> trial, for intermediate values
        self._evidence: dict[int, Evidence] = {}  # what was known when each trial started
        self._in_full: set[int] = set()  # never pruned: the references, and what the strategy asks
        self._extended: set[int] = set()  # trials measuring past bench.repeats (close to the best)

    def in_full(self, number: int) -> None:
        """Measure trial ``number`` in full (never pruned)."""
        self._in_full.add(number)

    def started(self, trial: TrialHandle, evidence: Evidence) -> None:
        self._live[trial.number] = trial
        self._evidence[trial.number] = evidence

    def finished(self, number: int) -> None:
        self._live.pop(number, None)
        self._evidence.pop(number, None)
        self._extended.discard(number)

    def on_runs(self, number: int, runs: Sequence[float]) -> RunDecision:
        """After each run: judge it, and show how many runs are done of how many planned."""
        decision = self._judge(number, runs)
        if decision is RunDecision.EXTEND:
            self._extended.add(number)
        cfg = self.cfg
        planned = cfg.max_repeats if number in self._extended else cfg.bench.repeats
        self.sink.runs(number, len(runs), max(planned, len(runs)))
        return decision

    def _judge(self, number: int, runs: Sequence[float]) -> RunDecision:
        """Report the running mean; prune a trial that cannot win; extend one close to the
        best."""
        cfg = self.cfg
        trial = self._live.get(number)
        if trial is not None:
            trial.report(float(sum(runs) / len(runs)), step=len(runs))
        evidence = self._evidence.get(number)
        if (
            cfg.study.pruning
            and number not in self._in_full
            and (trial is None or trial.repeat_of is None)
        ):
            incumbent = self.ledger.incumbent()
            # Before any configuration was started twice the start noise is the prior's, and an
            # unlucky first start of a 3 %-noise node would be pruned as if it were 1 %.
            between = (
                evidence.one_start_between() if evidence is not None else cfg.study.start_noise
            )
            if incumbent is not None and cannot_beat(
                runs, incumbent.runs, min_runs=cfg.study.prune_min_runs, between=between
            ):
                return RunDecision.PRUNE
        if (
            evidence is not None
            and trial is not None
            and len(runs) >= cfg.bench.repeats
            and cfg.max_repeats > cfg.bench.repeats
            and wants_more_runs(
                runs,
                evidence.points,
                evidence.noise,
                key=evidence.key_of(trial.candidate),
                floor=bool(trial.role),
            )  # fmt: skip
        ):
            return RunDecision.EXTEND
        return RunDecision.CONTINUE
