"""The study folder: the one place that names every file a study writes.

A study is one folder (``<output.dir>/<study.name>``); the driver, the report, preflight and the
tests all reach its files through :class:`StudyFolder`, so a new file is added here once and a
reader never spells a name of its own.

    folder = StudyFolder("runs/eagle3-twin")
    folder.trial_file(3)      # runs/eagle3-twin/trials/trial-000003.parquet
    folder.best_sh            # runs/eagle3-twin/best.sh
"""

from __future__ import annotations

import dataclasses
import os

from rayspec.metrics import EXPORTER_FILE  # the metrics reader names it (it imports no store)

__all__ = ["StudyFolder"]


@dataclasses.dataclass(frozen=True)
class StudyFolder:
    """Every path of one study folder (nothing here touches the disk).

    Attributes:
        root: the study folder, as given (relative paths stay relative).
    """

    root: str

    # Measured data: one Parquet file per trial, and that trial's requests.
    @property
    def trials(self) -> str:
        return os.path.join(self.root, "trials")

    @property
    def requests(self) -> str:
        return os.path.join(self.root, "requests")

    @property
    def categories(self) -> str:
        """Each trial's figures per prompt category: one row per category it reached."""
        return os.path.join(self.root, "categories")

    @property
    def logs(self) -> str:
        """Each trial's server log (``trial-NNNNNN.log``)."""
        return os.path.join(self.root, "logs")

    def trial_file(self, number: int) -> str:
        return os.path.join(self.trials, self.trial_name(number))

    def request_file(self, number: int) -> str:
        return os.path.join(self.requests, self.trial_name(number))

    def category_file(self, number: int) -> str:
        return os.path.join(self.categories, self.trial_name(number))

    def log_file(self, number: int) -> str:
        return os.path.join(self.logs, f"trial-{number:06d}.log")

    @staticmethod
    def trial_name(number: int) -> str:
        """The file name a trial's rows are kept under, in ``trials/``, ``requests/`` and
        ``categories/``."""
        return f"trial-{number:06d}.parquet"

    @staticmethod
    def trial_number(name: str) -> int | None:
        """The trial number a :meth:`trial_name` names (None for any other file name)."""
        stem = name.removeprefix("trial-").removesuffix(".parquet")
        if name.startswith("trial-") and name.endswith(".parquet") and stem.isdigit():
            return int(stem)
        return None

    @staticmethod
    def damaged_name(number: int) -> str:
        """An unreadable trial file set aside (kept for inspection, never read)."""
        return f".damaged-trial-{number:06d}.parquet"

    # The study's own state.
    @property
    def journal(self) -> str:
        """The default Optuna storage (``study.storage`` empty)."""
        return os.path.join(self.root, "optuna.journal")

    @property
    def lock(self) -> str:
        """Held (``flock``) by the one driver running this study."""
        return os.path.join(self.root, "study.lock")

    @property
    def search_space(self) -> str:
        """The search space as declared: the report reads candidates back through it."""
        return os.path.join(self.root, "search_space.json")

    @property
    def nccl_screen(self) -> str:
        """The NCCL screen's classes, reused by a resumed study."""
        return os.path.join(self.root, "nccl_screen.json")

    @property
    def ray_metrics(self) -> str:
        """Where this study's Ray metrics are exported (``python -m rayspec.metrics``)."""
        return os.path.join(self.root, EXPORTER_FILE)

    @property
    def adaptive_tiers(self) -> str:
        """SGLang's adaptive-steps tiers for the pick, per load."""
        return os.path.join(self.root, "adaptive_tiers.json")

    # What the study hands the user.
    @property
    def best_yaml(self) -> str:
        return os.path.join(self.root, "best.yaml")

    @property
    def best_sh(self) -> str:
        """The pick as the real SGLang launch."""
        return os.path.join(self.root, "best.sh")

    @property
    def best_adaptive_sh(self) -> str:
        """The per-load plan (adaptive tiers) when the report offers it but best.sh is not it."""
        return os.path.join(self.root, "best-adaptive.sh")

    @property
    def best_static_sh(self) -> str:
        """The static pick when the report recommends the per-load plan (then best.sh)."""
        return os.path.join(self.root, "best-static.sh")

    @property
    def best_twin_sh(self) -> str:
        """A twin study's pick, served by the twin where the study ran."""
        return os.path.join(self.root, "best-twin.sh")

    @property
    def report_md(self) -> str:
        return os.path.join(self.root, "report.md")

    @property
    def plots(self) -> str:
        return os.path.join(self.root, "plots")

    # Every name above, for checks that must cover them all (a new one is listed by itself).
    def folders(self) -> tuple[str, ...]:
        """The study's own subfolders (the study writes files into them)."""
        return (self.trials, self.requests, self.categories, self.logs, self.plots)

    def files(self) -> tuple[str, ...]:
        """The files the study writes at the top of its folder (every path property that is
        not one of :meth:`folders`)."""
        props = [n for n, v in vars(StudyFolder).items() if isinstance(v, property)]
        paths = [getattr(self, n) for n in props]
        return tuple(p for p in paths if p not in self.folders())
