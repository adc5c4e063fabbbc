"""The strategy seam: how a study chooses what to launch next.

The study loop (:func:`rayspec.tune.run_study`) knows one interface, :class:`Strategy`, the way
Optuna's study knows :class:`~optuna.samplers.BaseSampler` and httpx's client knows a
transport. Each time a slot is free and nothing is queued (the baseline, ``study.enqueue`` and
retries of interrupted trials go first), the loop calls :meth:`Strategy.ask` with the study,
everything observed so far and the configurations running now; the answer is a trial to start
or a :class:`Wait`. Two strategies exist:

- :class:`~rayspec.search.StructuredSearch` (``study.sampler: structured``, the default):
  proposes from the observations by the problem's structure and queues its proposal into the
  Optuna study, which stays the record.
- :class:`SamplerStrategy` (``tpe``, ``random``, ``grid``): Optuna's sampler chooses inside
  ``study.ask()``.

A new strategy is a subclass here and one line where the driver builds it
(``rayspec/tune/_strategy.py``); the loop does not change.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rayspec._types import Candidate
from rayspec.search._history import Env
from rayspec.search._history import Observation

if TYPE_CHECKING:
    from rayspec.search._study import StudyHandle
    from rayspec.search._study import TrialHandle

__all__ = ["SamplerStrategy", "Strategy", "Wait"]


@dataclass(frozen=True)
class Wait:
    """No trial to start now.

    Attributes:
        done: why the search is over (the study stops starting trials); empty: one may come
            once a running trial ends.
    """

    done: str = ""


class Strategy(abc.ABC):
    """Chooses the study's next configuration from what it has observed and what is running."""

    @abc.abstractmethod
    def ask(
        self,
        study: StudyHandle,
        observations: Sequence[Observation],
        running: Sequence[Candidate],
    ) -> TrialHandle | Wait:
        """The next trial (asked of ``study``), or :class:`Wait`.

        Args:
            study: the opened study; a strategy asks its trial of it (with the configuration
                it chose, or letting Optuna's sampler choose).
            observations: every trial the study has recorded, in order (a resume's too).
            running: the configurations running in other slots now.
        """

    def equivalent(self, env: Env) -> Env:
        """The NCCL set that stands for ``env`` when starts are pooled into one point (the
        structured search pools the sets its screen cannot tell apart); ``env`` itself by
        default."""
        return env

    def extend(self, until: int) -> None:
        """The study had stopped by itself and is run again with a larger
        ``study.max_restarts``: the added restarts are the user's to spend, up to ``until``
        server launches in all (a strategy with a stop rule of its own lifts it until then).
        Nothing by default."""
        return None

    def measured_in_full(self, candidate: Candidate) -> bool:
        """Whether a trial of ``candidate`` must not be pruned (the references always are
        measured in full; this adds what the strategy itself needs in full)."""
        del candidate
        return False


class SamplerStrategy(Strategy):
    """Optuna's sampler chooses (``study.sampler``: ``tpe``, ``random``, ``grid``).

    The sampler itself lives in the study (:func:`~rayspec.search.open_study` builds it from
    the config): this strategy only says when to ask it. A grid that has handed out every point
    is done; one whose unfinished points all run waits (asked now, Optuna's grid would hand out
    a running point again).
    """

    def ask(
        self,
        study: StudyHandle,
        observations: Sequence[Observation],
        running: Sequence[Candidate],
    ) -> TrialHandle | Wait:
        del observations, running  # Optuna's sampler reads the study itself
        if study.exhausted():
            return Wait(done="every configuration of the grid was tried")
        if study.grid_waits():
            return Wait()
        return study.ask()
