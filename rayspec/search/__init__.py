"""The search: the space, the strategy, the evidence and the Optuna study.

Only this package imports optuna.
"""

from __future__ import annotations

from rayspec.search._belief import Belief
from rayspec.search._belief import Decision
from rayspec.search._belief import believe
from rayspec.search._belief import decide
from rayspec.search._history import Equivalence
from rayspec.search._history import Evidence
from rayspec.search._history import Observation
from rayspec.search._history import Pick
from rayspec.search._history import Point
from rayspec.search._history import pick
from rayspec.search._history import weigh
from rayspec.search._posterior import Estimate
from rayspec.search._posterior import Noise
from rayspec.search._posterior import prob_better
from rayspec.search._posterior import prob_positive
from rayspec.search._resume import validate_enqueue
from rayspec.search._space import SearchSpace
from rayspec.search._space import canonical_key
from rayspec.search._stored import StoredStudy
from rayspec.search._stored import StoredTrial
from rayspec.search._stored import read_stored_study
from rayspec.search._strategy import SamplerStrategy
from rayspec.search._strategy import Strategy
from rayspec.search._strategy import Wait
from rayspec.search._structured import Proposal
from rayspec.search._structured import StructuredSearch
from rayspec.search._structured import wants_more_runs
from rayspec.search._study import StudyHandle
from rayspec.search._study import TrialHandle
from rayspec.search._study import open_study
from rayspec.search._valued import BeliefSearch

__all__ = [
    "Belief",
    "BeliefSearch",
    "Decision",
    "Equivalence",
    "Estimate",
    "Evidence",
    "Noise",
    "Observation",
    "Pick",
    "Point",
    "Proposal",
    "SamplerStrategy",
    "SearchSpace",
    "StoredStudy",
    "StoredTrial",
    "Strategy",
    "StructuredSearch",
    "StudyHandle",
    "TrialHandle",
    "Wait",
    "believe",
    "canonical_key",
    "decide",
    "open_study",
    "pick",
    "prob_better",
    "prob_positive",
    "read_stored_study",
    "validate_enqueue",
    "wants_more_runs",
    "weigh",
]
