"""Progress while a study runs: today's plain lines off a terminal, a live display on one; the
pick so far includes a resumed study's earlier trials; reused results say so."""

from __future__ import annotations

import io

from rich.console import Console

from rayspec._config import load_config
from rayspec.testing import SimulatedTrials
from rayspec.tune import run_study
from rayspec.tune._progress import LiveProgress
from rayspec.tune._progress import PickView
from rayspec.tune._progress import PlainProgress
from rayspec.tune._progress import fit_label
from rayspec.tune._progress import make_progress
from rayspec.tune._report import format_table
from tests.helpers import twin_doc
from tests.helpers import write_experiment


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_the_lines_are_todays() -> None:
    lines: list[str] = []
    progress = make_progress(lines.append, stream=io.StringIO())
    assert type(progress) is PlainProgress
    with progress:
        progress.trial_started(3, "EAGLE3 2 steps, topk 1, 3 draft tokens; NCCL default")
        progress.phase(3, "benchmarking")
        progress.runs(3, 1, 5)
        progress.status(used=2, budget=14, pick=PickView(97.3, (1,), 0.61))
        progress.trial_finished(3)
        progress.line("[restart 3/14] trial 3: ...")
    assert lines == ["[trial 3] benchmarking", "[restart 3/14] trial 3: ..."]


def test_on_a_terminal_a_live_display() -> None:
    assert isinstance(make_progress(print, stream=_Tty()), LiveProgress)


def _live(now: list[float], width: int = 120) -> tuple[LiveProgress, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=width, color_system=None)
    return LiveProgress(console, max_wall_s=None, clock=lambda: now[0]), out


def _text(progress: LiveProgress) -> str:
    buf = io.StringIO()
    Console(file=buf, force_terminal=True, width=120, color_system=None).print(progress.render())
    return buf.getvalue()


def test_the_live_display_shows_budget_phase_runs_pick_and_time() -> None:
    now = [100.0]
    progress, out = _live(now)
    assert "starting" in _text(progress)
    progress.status(used=2, budget=14, pick=None)
    progress.trial_started(12, "EAGLE3 2 steps, topk 4, 6 draft tokens; P2P_LEVEL=SYS PROTO=LL")
    progress.phase(12, "starting server")
    text = _text(progress)
    assert "2/14" in text and "starting server · EAGLE3 2 steps, topk 4" in text
    assert "no pick yet" in text and "time left: after the first restart" in text
    progress.phase(12, "benchmarking")
    assert "warm-up · EAGLE3" in _text(progress)
    progress.runs(12, 2, 3)
    assert "run 3 of 3 · " in _text(progress)
    progress.runs(12, 3, 15)  # close to the best: measured past the plan
    assert "run 4 of 15 · " in _text(progress)
    now[0] += 120.0  # two minutes for the first restart of this run: 11 left
    progress.trial_finished(12)
    progress.status(used=3, budget=14, pick=PickView(97.3, (12,), 0.61))
    text = _text(progress)
    assert not any(line.startswith("trial 12") for line in text.splitlines())  # finished
    assert "3/14" in text and "2 min 00 s elapsed, at most ~22 min 00 s left" in text
    assert "best so far 97.3 tok/s (trial 12), +61 % vs baseline" in text
    # Finished-trial lines go above the panel, timestamped, with brackets left alone.
    with progress:
        progress.line("[restart 3/14] trial 12 (tree ladder): ...")
    assert "[restart 3/14] trial 12 (tree ladder): ..." in out.getvalue()


def test_the_wall_clock_bounds_the_time_left() -> None:
    now = [0.0]
    progress, _ = _live(now)
    progress.max_wall_s = 600.0
    progress.status(used=0, budget=30, pick=None)
    now[0] = 300.0
    progress.status(used=1, budget=30, pick=None)
    assert "at most ~5 min 00 s left" in _text(progress)


class _Recorder(PlainProgress):
    def __init__(self) -> None:
        super().__init__(lambda _line: None)
        self.events: list[tuple[str, object]] = []

    def status(self, *, used: int, budget: int, pick: PickView | None) -> None:
        self.events.append(("status", (used, budget, pick)))

    def trial_finished(self, trial: int) -> None:
        self.events.append(("finished", trial))

    def runs(self, trial: int, done: int, planned: int) -> None:
        self.events.append(("runs", (trial, done, planned)))


def _study(tmp_path, restarts: int, search: dict | None = None, **study):
    doc = twin_doc(str(tmp_path), bench={"warmup": 1, "repeats": 2, "max_tokens": 60},
                   search=search or {})  # fmt: skip
    doc["study"].pop("n_trials")
    doc["study"].update({"max_restarts": restarts, **study})
    return load_config(write_experiment(str(tmp_path), doc))


def test_a_resumed_study_starts_from_its_best_so_far(tmp_path) -> None:
    first = run_study(_study(tmp_path, 3), trial_fn=SimulatedTrials(), printer=lambda _l: None)
    best = first.report.best
    assert best is not None
    recorder = _Recorder()
    lines: list[str] = []
    run_study(_study(tmp_path, 4), trial_fn=SimulatedTrials(), printer=lines.append,
              progress=recorder)  # fmt: skip
    kind, (used, budget, pick) = recorder.events[0]  # type: ignore[misc]
    assert kind == "status" and (used, budget) == (3, 4)
    assert pick is not None and pick.trials == best.trials  # before any new trial finished
    assert abs(pick.tok_s - best.tok_s_mean) < 1e-6
    # Runs are reported as done of planned while the new trial measures.
    runs = [e[1] for e in recorder.events if e[0] == "runs"]
    assert runs and runs[0] == (3, 1, 2)


def test_reused_results_say_so_in_the_line_and_the_table(tmp_path) -> None:
    search = {"speculative": {"modes": ["off"]}, "nccl": {"NCCL_PROTO": ["LL"]}}
    cfg = _study(tmp_path, 30, search, sampler="random", n_trials=6)
    lines: list[str] = []
    outcome = run_study(cfg, trial_fn=SimulatedTrials(), printer=lines.append)
    reused = [line for line in lines if "-> reused trial " in line]
    assert len(reused) == 4 and all(line.startswith("[no restart] trial ") for line in reused)
    table = format_table(outcome.report)
    assert "(reused by trial" in table
    assert sum(len(r.reused_by) for r in outcome.report.rows) == 4


def test_a_pick_pooled_over_many_starts_says_how_many_it_does_not_list() -> None:
    assert PickView(97.3, (1, 10, 11, 13)).describe() == "97.3 tok/s (trial 1+10+11+13)"
    many = PickView(95.1, (1, 10, 11, 13, 15, 17), 0.54).describe()
    assert many == "95.1 tok/s (trial 1+10+11+13+2 more), +54 % vs baseline"


# -- 80 columns ---------------------------------------------------------------------------------
LONG = (
    "EAGLE3 2 steps, topk 1, 3 draft tokens; ALGO=Ring BUFFSIZE=16777216 MAX_NCHANNELS=16 "
    "NTHREADS=512 P2P_LEVEL=SYS PROTO=LL"
)


def test_a_long_label_keeps_its_speculative_settings_and_says_how_much_nccl_it_left_out() -> None:
    assert fit_label(LONG, len(LONG)) == LONG  # what fits is untouched
    short = fit_label(LONG, 54)
    assert short == "EAGLE3 2 steps, topk 1, 3 tok; ALGO=Ring +5 more"
    assert fit_label(LONG, 80).startswith("EAGLE3 2 steps, topk 1, 3 tok; ALGO=Ring BUFFSIZE=16M")
    for width in range(10, 120):
        assert len(fit_label(LONG, width)) <= width


def test_the_live_rows_fit_80_columns_with_the_phase_and_the_settings() -> None:
    now = [100.0]
    progress, _ = _live(now, width=80)
    progress.status(used=7, budget=14, pick=PickView(97.3, (1, 10, 11, 13, 20, 21), 0.61))
    progress.trial_started(1234, LONG)
    progress.phase(1234, "benchmarking")
    progress.runs(1234, 3, 15)
    now[0] += 3725.0  # an hour in: the longest durations
    rows = progress.rows(80)
    widths = [max(len(n) for n, _ in rows) + 1 + len(text) for _, text in rows]
    assert max(widths) <= 80, rows
    trial = dict(rows)["trial 1234"]
    assert trial.startswith("run 4 of 15 · EAGLE3 2 steps, topk 1, 3 tok; ") and "more" in trial
    buf = io.StringIO()
    Console(file=buf, force_terminal=True, width=80, color_system=None).print(progress.render())
    drawn = buf.getvalue().splitlines()
    assert drawn and all(len(line.rstrip()) <= 80 for line in drawn)
    assert not any("…" in line for line in drawn)  # nothing left for rich to cut
