"""rayspec.bench: the client side of a trial.

A :class:`BenchPlan` of :class:`Scenario` s is run against a live server by
:func:`run_benchmark` (or :data:`BenchActor` on the server's node); every request becomes a
:class:`~rayspec.RequestRecord`, and :func:`summarize` / :func:`compare` turn records into
float metrics and significance statements. :func:`run_sharded` spreads a load that one client
process cannot stream on its own over several BenchActors.
"""

from __future__ import annotations

from rayspec._types import CATEGORY_METRICS
from rayspec._types import accept_histogram
from rayspec._types import category_key
from rayspec.bench._actor import BenchActor
from rayspec.bench._actor import BenchWorker
from rayspec.bench._actor import RaySync
from rayspec.bench._actor import merge_results
from rayspec.bench._actor import run_sharded
from rayspec.bench._client import StreamClient
from rayspec.bench._client import StreamResult
from rayspec.bench._client import failure_of
from rayspec.bench._plan import BenchPlan
from rayspec.bench._plan import Scenario
from rayspec.bench._prompts import PromptRecord
from rayspec.bench._prompts import RequestInput
from rayspec.bench._prompts import builtin_prompt_sets
from rayspec.bench._prompts import dataset_categories
from rayspec.bench._prompts import load_dataset
from rayspec.bench._prompts import load_prompts
from rayspec.bench._prompts import request_input
from rayspec.bench._runner import BenchResult
from rayspec.bench._runner import RunReport
from rayspec.bench._runner import RunSync
from rayspec.bench._runner import Shard
from rayspec.bench._runner import arun_benchmark
from rayspec.bench._runner import fetch_server_view
from rayspec.bench._runner import first_failure
from rayspec.bench._runner import flush_cache
from rayspec.bench._runner import parse_metrics
from rayspec.bench._runner import raise_for_failure
from rayspec.bench._runner import run_benchmark
from rayspec.bench._runner import run_benchmark_detailed
from rayspec.bench._slo import SLO_METRICS
from rayspec.bench._slo import meets_slo
from rayspec.bench._slo import per_run_goodput
from rayspec.bench._slo import slo_metrics
from rayspec.bench._stats import Comparison
from rayspec.bench._stats import category_metrics
from rayspec.bench._stats import compare
from rayspec.bench._stats import mean_ci95
from rayspec.bench._stats import per_run_tok_s
from rayspec.bench._stats import run_tok_s
from rayspec.bench._stats import summarize
from rayspec.bench._tdist import t_cdf
from rayspec.bench._tdist import t_ppf

__all__ = [
    "BenchActor",
    "BenchPlan",
    "BenchResult",
    "BenchWorker",
    "CATEGORY_METRICS",
    "Comparison",
    "PromptRecord",
    "RaySync",
    "RequestInput",
    "RunReport",
    "RunSync",
    "SLO_METRICS",
    "Scenario",
    "Shard",
    "StreamClient",
    "StreamResult",
    "accept_histogram",
    "arun_benchmark",
    "builtin_prompt_sets",
    "category_key",
    "category_metrics",
    "compare",
    "dataset_categories",
    "failure_of",
    "fetch_server_view",
    "first_failure",
    "flush_cache",
    "load_dataset",
    "load_prompts",
    "mean_ci95",
    "meets_slo",
    "merge_results",
    "parse_metrics",
    "per_run_goodput",
    "per_run_tok_s",
    "raise_for_failure",
    "request_input",
    "run_benchmark",
    "run_benchmark_detailed",
    "run_sharded",
    "run_tok_s",
    "slo_metrics",
    "summarize",
    "t_cdf",
    "t_ppf",
]
