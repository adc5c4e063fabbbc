"""Where trials land: one Parquet row per trial and per request; and recorded landscapes."""

from __future__ import annotations

from rayspec.store._base import BaseTrialStore
from rayspec.store._categories import CATEGORY_SCHEMA
from rayspec.store._checks import check_folder
from rayspec.store._checks import folder_problems
from rayspec.store._folder import StudyFolder
from rayspec.store._landscape import LANDSCAPE_META_KEY
from rayspec.store._landscape import LANDSCAPE_SCHEMA
from rayspec.store._landscape import Landscape
from rayspec.store._landscape import LandscapeRow
from rayspec.store._landscape import read_landscape
from rayspec.store._landscape import write_landscape
from rayspec.store._parquet import REQUEST_SCHEMA
from rayspec.store._parquet import TRIAL_METRICS
from rayspec.store._parquet import TRIAL_SCHEMA
from rayspec.store._parquet import ParquetTrialStore
from rayspec.store._parquet import record_of_row
from rayspec.store._parquet import request_record
from rayspec.store._parquet import trial_schema

__all__ = [
    "BaseTrialStore",
    "CATEGORY_SCHEMA",
    "LANDSCAPE_META_KEY",
    "LANDSCAPE_SCHEMA",
    "Landscape",
    "LandscapeRow",
    "ParquetTrialStore",
    "REQUEST_SCHEMA",
    "StudyFolder",
    "TRIAL_METRICS",
    "TRIAL_SCHEMA",
    "check_folder",
    "folder_problems",
    "record_of_row",
    "request_record",
    "read_landscape",
    "trial_schema",
    "write_landscape",
]
