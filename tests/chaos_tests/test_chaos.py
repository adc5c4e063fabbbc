"""Chaos: seeded random faults at random points of small twin studies, then resume; the
invariants hold after every run (see ``_chaos.py`` for the faults and the invariants).

Bounded for CI: ``RAYSPEC_CHAOS_CASES`` cases (default 24, about 20 s on two cores), drawn from
``RAYSPEC_CHAOS_SEED`` (default fixed, so CI is reproducible); a failure names its case's seed
and the two variables that replay it alone. A longer manual run: ``RAYSPEC_CHAOS_CASES=500``
with any ``RAYSPEC_CHAOS_SEED``.
"""

from __future__ import annotations

import os

import pytest

from tests.chaos_tests._chaos import CASES_ENV
from tests.chaos_tests._chaos import Tally
from tests.chaos_tests._chaos import base_seed
from tests.chaos_tests._chaos import draw_case
from tests.chaos_tests._chaos import run_case

N_CASES = int(os.environ.get(CASES_ENV, "24"))
TALLY = Tally()


@pytest.fixture(scope="module", autouse=True)
def _summary():
    yield
    print(f"\nchaos (in-process): {TALLY.cases} cases from seed {base_seed()}, {TALLY.runs} "
          f"driver runs, {TALLY.faults} faults, {TALLY.refusals} refusals, {TALLY.invariants} "
          "invariant checks")  # fmt: skip


@pytest.mark.parametrize("index", range(N_CASES))
def test_chaos_case(tmp_path, index: int) -> None:
    case = draw_case(base_seed() + index)
    try:
        run_case(case, str(tmp_path), TALLY)
    except BaseException as exc:
        raise AssertionError(f"{case.describe()}: {type(exc).__name__}: {exc}") from exc
