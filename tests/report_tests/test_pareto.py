"""The report's Pareto table: tok/s per GPU against tok/s per user over configurations and
loads, the front marked (results/_pareto.py, report/_markdown.py)."""

from __future__ import annotations

import os

from hypothesis import given
from hypothesis import strategies as st

from rayspec import Candidate
from rayspec import LaunchSpec
from rayspec import SpecSettings
from rayspec import TrialRecord
from rayspec import TrialResult
from rayspec._types import TrialState
from rayspec.report._load import StudyData
from rayspec.report._load import load_study_folder
from rayspec.report._markdown import pareto_table
from rayspec.report._markdown import render
from rayspec.report._plots import plot_pareto
from rayspec.results import pareto_front
from rayspec.results import save_space
from rayspec.search import SearchSpace
from rayspec.store import ParquetTrialStore
from tests.helpers import single_and_c8_requests

LAUNCH = LaunchSpec(
    argv=("python", "-m", "sglang.launch_server", "--port", "30000"), env=(), host="127.0.0.1",
    port=30000, log_path="/tmp/x.log", startup_timeout_s=10, engine="twin",
)  # fmt: skip


def _dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] >= b[0] and a[1] >= b[1] and a != b


# Few distinct values, so ties and duplicates are common.
_points = st.lists(st.tuples(st.integers(0, 6).map(float), st.integers(0, 6).map(float)),
                   max_size=30)  # fmt: skip


@given(_points)
def test_the_front_is_exactly_the_undominated_points(points) -> None:
    front = pareto_front(points)
    assert len(front) == len(points)
    for p, on in zip(points, front, strict=True):
        dominated = any(_dominates(q, p) for q in points)
        assert on is not dominated
        if not on:  # dominated by a point of the front itself
            assert any(_dominates(q, p) for q, f in zip(points, front, strict=True) if f)


def _trial(n: int, spec: SpecSettings | None, single: tuple[float, float],
           c8: tuple[float, float], violation: float,
           c8_violation: float | None = None) -> TrialResult:  # fmt: skip
    records = single_and_c8_requests()
    return TrialResult(
        trial=n, state=TrialState.COMPLETE, value=single[0], candidate=Candidate(spec=spec),
        launch=LAUNCH, requests=records, start_unix_s=1.0, end_unix_s=2.0,
        metrics={"tok_s_mean": single[0], "user_tok_s_mean": single[1],
                 "c8__tok_s_mean": c8[0], "c8__user_tok_s_mean": c8[1],
                 "slo_violation": violation,
                 "c8__slo_violation": violation if c8_violation is None else c8_violation},
    )  # fmt: skip


def test_the_report_marks_the_front_over_configurations_and_loads(tmp_path) -> None:
    root = str(tmp_path / "pareto")
    store = ParquetTrialStore(root, scenarios=["c8"])
    trials = [  # (tok/s, tok/s per user) at batch 1 and at concurrency 8
        (_trial(0, None, (60.0, 62.0), (300.0, 40.0), -0.5), "baseline"),
        (_trial(1, SpecSettings("EAGLE3", 3, 1, 4), (92.0, 95.0), (380.0, 50.0), 0.2), ""),
        (_trial(2, SpecSettings("EAGLE3", 2, 4, 6), (90.0, 93.0), (450.0, 45.0), -0.1), ""),
    ]
    data = _stored(root, store, trials)
    rows = [line.split(" | ") for line in pareto_table(data)[2:]]
    marked = {(r[0].strip("| "), r[2].split(" ")[0]) for r in rows if "**front**" in r[5]}
    # Trial 1 at batch 1 (the fastest user), trial 2 at c8 (the most per GPU),
    # trial 1 at c8 (more per user than trial 2's c8); the rest are dominated.
    assert marked == {("1", "single"), ("2", "c8"), ("1", "c8")}
    assert len(rows) == 6
    assert all(r[6].strip(" |") == ("no" if r[0].strip("| ") == "1" else "yes") for r in rows)
    plot = plot_pareto(data, str(tmp_path / "pareto.png"))
    assert plot.path and os.path.getsize(plot.path) > 0
    text = render(data, [], root)
    assert "## Throughput against interactivity" in text
    assert "misses the SLO" in text  # trial 1's row in the configuration table


def test_feasible_means_the_objective_scenario(tmp_path) -> None:
    """A configuration that meets the SLO at the objective scenario's load and misses it at
    another is feasible: it is picked over a faster one that misses it at the objective, and
    the Pareto table says per load where it met it."""
    root = str(tmp_path / "loads")
    store = ParquetTrialStore(root, scenarios=["c8"])
    trials = [
        (_trial(0, None, (60.0, 62.0), (300.0, 40.0), -0.5), "baseline"),
        (_trial(1, SpecSettings("EAGLE3", 3, 1, 4), (92.0, 95.0), (380.0, 50.0), 0.2, -0.3), ""),
        (_trial(2, SpecSettings("EAGLE3", 2, 4, 6), (90.0, 93.0), (450.0, 45.0), -0.1, 0.4), ""),
    ]
    data = _stored(root, store, trials)
    best = data.report.best
    assert best is not None and best.trials == (2,) and best.feasible
    rows = [line.split(" | ") for line in pareto_table(data)[2:]]
    meets = {(r[0].strip("| "), r[2].split(" ")[0]): r[6].strip(" |") for r in rows}
    assert meets[("2", "single")] == "yes" and meets[("2", "c8")] == "no"
    assert meets[("1", "single")] == "no" and meets[("1", "c8")] == "yes"


def test_the_plot_reads_the_points_from_the_pure_module() -> None:
    """pareto.png and the report's table draw the same points (results/_pareto.py); the plots
    module never imports the Markdown one, at the top or inside a function."""
    import ast
    import pathlib

    import rayspec.report._plots as plots

    tree = ast.parse(pathlib.Path(plots.__file__).read_text(encoding="utf-8"))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "rayspec.report._markdown" not in imported
    assert "rayspec.results" in imported


def _stored(root: str, store: ParquetTrialStore, trials: list) -> StudyData:  # type: ignore[type-arg]
    """Write ``trials`` ((result, role) in restart order) with their space; load the folder."""
    space = SearchSpace(modes=("off", "EAGLE3"), num_steps=(2, 3), eagle_topk=(1, 4),
                        num_draft_tokens=(4, 6), nccl=(), flags=())  # fmt: skip
    save_space(root, space)
    for restart, (result, role) in enumerate(trials, 1):
        assert result.value is not None
        store.append_trial(TrialRecord(result, params=space.params_of(result.candidate),
                                       role=role, restart=restart,
                                       run_values=(result.value,)))  # fmt: skip
    return load_study_folder(root)


def test_a_load_where_every_point_missed_the_slo_is_still_in_the_legend(
    tmp_path, monkeypatch
) -> None:
    """Every configuration misses the SLO at c8 (hollow markers only): the plot's legend still
    names c8, and says the hollow points missed the SLO."""
    from rayspec.report import _plots

    root = str(tmp_path / "legend")
    store = ParquetTrialStore(root, scenarios=["c8"])
    trials = [
        (_trial(0, None, (60.0, 62.0), (300.0, 40.0), -0.5, 0.3), "baseline"),
        (_trial(1, SpecSettings("EAGLE3", 3, 1, 4), (92.0, 95.0), (380.0, 50.0), -0.2, 0.4), ""),
    ]
    data = _stored(root, store, trials)
    seen: list[list[str]] = []

    def keep(fig, path):  # type: ignore[no-untyped-def]
        seen.append([t.get_text() for t in fig.axes[0].get_legend().get_texts()])
        return path

    monkeypatch.setattr(_plots, "_save", keep)
    plot_pareto(data, str(tmp_path / "pareto.png"))
    assert seen and "c8, missed study.slo" in seen[0] and "single" in seen[0], seen
