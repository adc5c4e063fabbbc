"""The figures the docs give about the benchmarks (benchmarks/results/README.md, which the README
links) match what the benchmarks do when run as printed (their defaults), and a plain benchmark
run leaves the shipped results alone."""

from __future__ import annotations

import os
import re

from tests.helpers import REPO
from tests.helpers import load_benchmark

RESULTS = os.path.join(REPO, "benchmarks", "results", "README.md")


def _results() -> str:
    with open(RESULTS, encoding="utf-8") as fh:
        return " ".join(fh.read().split())


def test_search_efficiency_study_counts() -> None:
    bench = load_benchmark("search_efficiency")
    defaults = bench.parser().parse_args([])
    strategies = len(defaults.strategies.split(","))
    cases = defaults.cases.split(",")
    studies = len(cases) * strategies * defaults.seeds
    text = _results()
    assert (
        f"`.venv/bin/python benchmarks/search_efficiency.py` drives the real study loop "
        f"{studies} times ({len(cases)} cases x {strategies} strategies x {defaults.seeds} seeds"
    ) in text
    # The table's subset: the --cases it names, and the number of studies it says they are.
    m = re.search(r"without SGLang's newer modes, (\d+) studies \(`--cases ([a-z/,]+)`\)", text)
    assert m is not None
    subset = m.group(2).split(",")
    assert set(subset) <= set(bench.CASES)
    assert int(m.group(1)) == len(subset) * strategies * defaults.seeds
    assert f"a budget of {defaults.budget} restarts" in text


def test_scaling_figures_and_results_file() -> None:
    bench = load_benchmark("scaling")
    defaults = bench.parser().parse_args([])
    text = _results()
    assert (
        f"`benchmarks/scaling.py` runs the same twin study ({defaults.budget} restarts, seed "
        f"{defaults.seed})"
    ) in text
    assert f"each trial lengthened by an {defaults.startup_s:g} s simulated server start" in text
    assert defaults.out is None  # a plain run prints; it never overwrites the shipped results
    with open(os.path.join(REPO, "benchmarks", "results", "scaling.txt"), encoding="utf-8") as fh:
        assert f"restart budget {defaults.budget}, seed {defaults.seed}" in fh.readline()
