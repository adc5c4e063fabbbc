"""Where trials land: one Parquet row per trial and per request."""

from __future__ import annotations

from rayspec.store._base import BaseTrialStore
from rayspec.store._categories import CATEGORY_SCHEMA
from rayspec.store._checks import check_folder
from rayspec.store._checks import folder_problems
from rayspec.store._folder import StudyFolder
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
    "ParquetTrialStore",
    "REQUEST_SCHEMA",
    "StudyFolder",
    "TRIAL_METRICS",
    "TRIAL_SCHEMA",
    "check_folder",
    "folder_problems",
    "record_of_row",
    "request_record",
    "trial_schema",
]
