"""Where trials land: one Parquet row per trial and per request."""

from __future__ import annotations

from rayspec.store._base import BaseTrialStore
from rayspec.store._parquet import REQUEST_SCHEMA
from rayspec.store._parquet import TRIAL_SCHEMA
from rayspec.store._parquet import ParquetTrialStore

__all__ = ["BaseTrialStore", "ParquetTrialStore", "REQUEST_SCHEMA", "TRIAL_SCHEMA"]
