"""A study's results: the configuration table and the pick, and the files that deploy it.

Both composers read a study's outcome through this package: ``rayspec.tune`` at the end of a
study (the terminal table, ``best.yaml``, ``best.sh``) and ``rayspec.report`` from a study folder
(``report.md``). It reads only stored records and what the study saved beside them.
"""

from __future__ import annotations

from rayspec.results._deploy import DRAFT_PLACEHOLDER
from rayspec.results._deploy import MODEL_PLACEHOLDER
from rayspec.results._deploy import deploy_config
from rayspec.results._deploy import deploy_script
from rayspec.results._deploy import plan_recommended
from rayspec.results._deploy import plan_script
from rayspec.results._deploy import twin_script
from rayspec.results._deploy import write_best
from rayspec.results._pareto import ParetoPoint
from rayspec.results._pareto import pareto_data
from rayspec.results._pareto import pareto_front
from rayspec.results._pareto import pareto_points
from rayspec.results._pick import GATE_UNCHECKED
from rayspec.results._pick import believes
from rayspec.results._pick import build_report
from rayspec.results._pick import candidate_reader
from rayspec.results._pick import cost_key
from rayspec.results._pick import observations_from_records
from rayspec.results._plan import PLAN_PARAM
from rayspec.results._plan import PLAN_ROLE
from rayspec.results._plan import VERDICT_HEADER
from rayspec.results._plan import LoadCheck
from rayspec.results._plan import Plan
from rayspec.results._plan import PlanVerdict
from rayspec.results._plan import cost_line
from rayspec.results._plan import plan_verdict
from rayspec.results._plan import recommend
from rayspec.results._plan import verdict_lines
from rayspec.results._plan import verdict_rows
from rayspec.results._saved import load_equivalence
from rayspec.results._saved import load_space
from rayspec.results._saved import save_space
from rayspec.results._sure import ABOVE_PEAK_WHY
from rayspec.results._sure import Gain
from rayspec.results._sure import above_peak
from rayspec.results._sure import gains
from rayspec.results._sure import interval
from rayspec.results._sure import prob_faster
from rayspec.results._sure import speculation_gain
from rayspec.results._sure import tie_note
from rayspec.results._sure import tied_with_pick
from rayspec.results._table import WITHIN_NOISE
from rayspec.results._table import Row
from rayspec.results._table import StudyReport
from rayspec.results._table import vs_baseline
from rayspec.results._table import within_noise

__all__ = [
    "believes",
    "ABOVE_PEAK_WHY",
    "DRAFT_PLACEHOLDER",
    "GATE_UNCHECKED",
    "Gain",
    "LoadCheck",
    "MODEL_PLACEHOLDER",
    "PLAN_PARAM",
    "PLAN_ROLE",
    "VERDICT_HEADER",
    "ParetoPoint",
    "Plan",
    "PlanVerdict",
    "WITHIN_NOISE",
    "Row",
    "StudyReport",
    "above_peak",
    "build_report",
    "candidate_reader",
    "cost_key",
    "cost_line",
    "deploy_config",
    "deploy_script",
    "gains",
    "interval",
    "load_equivalence",
    "load_space",
    "observations_from_records",
    "pareto_data",
    "pareto_front",
    "pareto_points",
    "plan_recommended",
    "plan_script",
    "plan_verdict",
    "prob_faster",
    "recommend",
    "save_space",
    "speculation_gain",
    "tie_note",
    "tied_with_pick",
    "twin_script",
    "verdict_lines",
    "verdict_rows",
    "vs_baseline",
    "within_noise",
    "write_best",
]
