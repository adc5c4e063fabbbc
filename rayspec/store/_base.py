"""The trial store interface."""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

    from rayspec._types import TrialRecord
    from rayspec._types import TrialResult


class BaseTrialStore(abc.ABC):
    """Where every trial of a study lands.

    Contract:
        - One row per trial, keyed by the Optuna trial number. Writing a trial again replaces
          its row, so a trial is in the store exactly once however often a resumed driver
          records it.
        - A row is written atomically: a reader sees the whole row or none of it, also after a
          crash mid-write.
        - Safe for one writer (the driver) and any number of readers.
    """

    @abc.abstractmethod
    def append_trial(self, record: TrialRecord | TrialResult) -> str:
        """Write ``record``'s trial row (and its request rows); return the trial file path.

        A bare :class:`~rayspec.TrialResult` is a record the study knows nothing more of.

        Raises:
            StoreError: the row could not be written.
        """

    @abc.abstractmethod
    def load_trials(self) -> pa.Table:
        """All trial rows (an empty table when none)."""

    @abc.abstractmethod
    def load_requests(self) -> pa.Table:
        """All request rows (an empty table when none)."""

    def trial_numbers(self) -> set[int]:
        """The Optuna numbers of the stored trials."""
        table = self.load_trials()
        if table.num_rows == 0:
            return set()
        return set(table.column("trial").to_pylist())
