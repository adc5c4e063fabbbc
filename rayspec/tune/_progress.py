"""How a running study shows its progress: plain lines, or a live display on a terminal.

The driver tells a progress object what happens (a line to print, a trial's phase, its runs,
the restarts used and the pick so far); the object decides what to show.

- :class:`PlainProgress` prints today's lines and nothing else: one per phase of a trial and
  one per finished trial. It is the choice whenever the output is not a terminal (CI, pipes,
  a log file), so logs read the same as before.
- :class:`TrialLines` writes the finished-trial lines (``[restart 3/20] trial 5 (chain
  ladder: 2 steps): ... -> 98.1 tok/s; pick ...``) to either.
- :class:`LiveProgress` (a terminal) prints the same finished-trial lines and keeps a live
  panel under them (``rich``): restarts used of the budget, each running trial's phase
  (starting server, warm-up, run k of n), the best so far and its gain over the baseline, the
  time spent and an estimate of the time left.

Thread safety: trial threads report phases and runs while the main thread prints; every method
may be called from any thread.

Example::

    with make_progress(printer) as progress:
        run_study(cfg, printer=progress.line, progress=progress)
"""

from __future__ import annotations

import math
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING
from typing import TextIO

from rayspec._plural import plural
from rayspec._types import TrialResult
from rayspec._types import TrialState

if TYPE_CHECKING:
    from rich.console import Console
    from rich.console import RenderableType
    from rich.live import Live

    from rayspec.search import TrialHandle

__all__ = ["LiveProgress", "PickView", "PlainProgress", "TrialLines", "fit_label", "make_progress"]

Printer = Callable[[str], None]


@dataclass(frozen=True)
class PickView:
    """The pick so far, as the progress shows it.

    Attributes:
        tok_s: its estimate (tok/s).
        trials: the trials that measured it.
        gain: its gain over the baseline (0.25 = +25 %); None without a baseline, or when the
            pick is the baseline.
    """

    tok_s: float
    trials: tuple[int, ...]
    gain: float | None = None

    def describe(self) -> str:
        trials = "+".join(str(t) for t in self.trials[:4])
        if len(self.trials) > 4:  # a long duel: say how many starts the estimate pools
            trials += f"+{len(self.trials) - 4} more"
        text = f"{self.tok_s:.1f} tok/s (trial {trials})"
        if self.gain is not None:
            text += f", {self.gain * 100:+.0f} % vs baseline"
        return text


class PlainProgress:
    """Plain lines through ``printer``: each phase of a trial, each finished trial.

    Args:
        printer: receives each line (the CLI timestamps and prints it).
    """

    def __init__(self, printer: Printer) -> None:
        self.printer = printer

    def line(self, text: str) -> None:
        """A line that stays (a finished trial, the screen, a warning)."""
        self.printer(text)

    def phase(self, trial: int, phase: str) -> None:
        """A running trial moved on (``starting server``, ``benchmarking``, ...)."""
        self.printer(f"[trial {trial}] {phase}")

    def trial_started(self, trial: int, what: str) -> None:
        """A trial was handed to a slot; ``what`` is its configuration."""

    def runs(self, trial: int, done: int, planned: int) -> None:
        """``done`` measured runs of the objective scenario, of ``planned``."""

    def trial_finished(self, trial: int) -> None:
        """A trial's result is recorded."""

    def status(self, *, used: int, budget: int, pick: PickView | None) -> None:
        """Restarts used of the budget and the pick so far (also right after a resume)."""

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


@dataclass
class _Running:
    what: str
    phase: str = "placing"
    done: int = 0
    planned: int = 0
    measuring: bool = False


_SHORTER = ((" draft tokens", " tok"), ("no speculation", "no spec"))
_BIG = re.compile(r"=(\d{5,})\b")


def _bytes(match: re.Match[str]) -> str:
    value = int(match.group(1))
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if value % size == 0:
            return f"={value // size}{unit}"
    return match.group(0)


def fit_label(label: str, width: int) -> str:
    """A configuration's label (:meth:`rayspec.Candidate.label`) in ``width`` characters,
    keeping what tells trials apart: the speculative settings whole, then as many NCCL
    variables as fit and how many more there are (``+3 more``), never a cut mid-word.

    Example:
        >>> fit_label("EAGLE3 2 steps, topk 4, 6 draft tokens; BUFFSIZE=16777216 PROTO=LL", 52)
        'EAGLE3 2 steps, topk 4, 6 tok; BUFFSIZE=16M PROTO=LL'
        >>> fit_label("EAGLE3 2 steps, topk 4, 6 draft tokens; BUFFSIZE=16777216 PROTO=LL", 44)
        'EAGLE3 2 steps, topk 4, 6 tok; +2 more'
    """
    if len(label) <= width:
        return label
    for long, short in _SHORTER:
        label = label.replace(long, short)
    label = _BIG.sub(_bytes, label)
    if len(label) <= width:
        return label
    head, _, rest = label.partition("; ")
    if len(head) + 2 > width:
        return head[: max(0, width - 1)] + "…"
    words = rest.split()
    for keep in range(len(words) - 1, -1, -1):
        more = f" +{len(words) - keep} more" if keep else f"+{len(words)} more"
        text = f"{head}; {' '.join(words[:keep])}{more}"
        if len(text) <= width:
            return text
    return head[: max(0, width - 1)] + "…"


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min {secs:02d} s"
    return f"{secs} s"


class LiveProgress(PlainProgress):
    """Finished-trial lines above a live panel of what runs now (``rich``, a terminal).

    Args:
        console: where to draw (default: a console on stdout).
        warmup: whether trials warm up before their measured runs (``bench.warmup`` > 0).
        max_wall_s: ``study.max_wall_s``, which bounds the estimate of the time left.
        clock: seconds, monotonic (tests pass a fake one).
    """

    def __init__(
        self,
        console: Console | None = None,
        *,
        warmup: bool = True,
        max_wall_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from rich.console import Console

        super().__init__(self._print)
        self.console = console if console is not None else Console()
        self.warmup = warmup
        self.max_wall_s = max_wall_s
        self._clock = clock
        self._lock = threading.Lock()
        self._t0 = clock()
        self._used = 0
        self._budget = 0
        self._first_used: int | None = None  # restarts used when this run started
        self._pick: PickView | None = None
        self._running: dict[int, _Running] = {}
        self._live: Live | None = None

    # -- what the driver reports -----------------------------------------------------------
    def _print(self, text: str) -> None:
        self.console.print(
            f"{time.strftime('%H:%M:%S')} {text}", markup=False, highlight=False, soft_wrap=True
        )

    def phase(self, trial: int, phase: str) -> None:
        with self._lock:
            run = self._running.setdefault(trial, _Running(what=""))
            run.phase = phase
            if phase.startswith("close to the best"):
                run.measuring = True
        self._refresh()

    def trial_started(self, trial: int, what: str) -> None:
        with self._lock:
            self._running[trial] = _Running(what=what)
        self._refresh()

    def runs(self, trial: int, done: int, planned: int) -> None:
        with self._lock:
            run = self._running.setdefault(trial, _Running(what=""))
            run.done, run.planned, run.measuring = done, planned, True
        self._refresh()

    def trial_finished(self, trial: int) -> None:
        with self._lock:
            self._running.pop(trial, None)
        self._refresh()

    def status(self, *, used: int, budget: int, pick: PickView | None) -> None:
        with self._lock:
            if self._first_used is None:
                self._first_used = used
                self._t0 = self._clock()
            self._used, self._budget, self._pick = used, budget, pick
        self._refresh()

    # -- what it shows ---------------------------------------------------------------------
    def _phase_text(self, run: _Running) -> str:
        if run.phase == "benchmarking" or run.phase.startswith("close to the best"):
            if not run.measuring:
                return "warm-up" if self.warmup else "run 1"
            if run.planned:
                return f"run {min(run.done + 1, run.planned)} of {run.planned}"
            return f"run {run.done + 1}"
        return run.phase

    def _time_left(self, elapsed: float) -> str:
        first = self._first_used if self._first_used is not None else self._used
        launched = self._used - first
        left = max(0, self._budget - self._used)
        if left == 0:
            return "no restarts left"
        estimate = elapsed / launched * left if launched > 0 else None
        if self.max_wall_s is not None:
            wall_left = max(0.0, self.max_wall_s - elapsed)
            estimate = wall_left if estimate is None else min(estimate, wall_left)
        if estimate is None:
            return "time left: after the first restart"
        # An upper bound: the search stops early once nothing left could beat the pick.
        return f"at most ~{_duration(estimate)} left"

    def rows(self, width: int = 80) -> list[tuple[str, str]]:
        """The live panel's rows, (name, text), each fitted to ``width`` columns with its name
        and the gap between them: a configuration's label loses NCCL variables before its
        speculative settings, never its phase (rich would cut the end of the line)."""
        with self._lock:
            elapsed = self._clock() - self._t0
            trials = [(f"trial {n}", run) for n, run in sorted(self._running.items())]
            pick = self._pick.describe() if self._pick is not None else "no pick yet"
            names = ["restarts", "best so far", *(name for name, _ in trials)]
            room = width - max(len(n) for n in names) - 1  # the grid's one-column gap
            restarts = "starting"
            if self._budget:
                times = f"{_duration(elapsed)} elapsed, {self._time_left(elapsed)}"
                head = f"{self._used}/{self._budget}"
                cells = max(4, min(16, room - len(head) - len(times) - 2))  # the bar gives way
                filled = int(round(cells * min(self._used, self._budget) / self._budget))
                restarts = f"{head} {'█' * filled}{'░' * (cells - filled)} {times}"
            out = [("restarts", restarts)]
            for name, run in trials:
                phase = self._phase_text(run)
                what = f" · {fit_label(run.what, room - len(phase) - 3)}" if run.what else ""
                out.append((name, f"{phase}{what}"))
            out.append(("best so far", pick))
            return [(name, text if len(text) <= room else text[: room - 1] + "…")
                    for name, text in out]  # fmt: skip

    def render(self) -> RenderableType:
        """The live panel as it stands (the display redraws it a few times a second)."""
        from rich.table import Table
        from rich.text import Text

        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column(no_wrap=True, overflow="ellipsis")
        for name, text in self.rows(self.console.width):
            grid.add_row(name, Text(text))
        return grid

    def _refresh(self) -> None:
        live = self._live
        if live is not None:
            live.refresh()

    def __enter__(self) -> LiveProgress:
        from rich.live import Live

        self._live = Live(
            get_renderable=self.render,
            console=self.console,
            refresh_per_second=2,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._live.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        live, self._live = self._live, None
        if live is not None:
            live.stop()


def make_progress(
    printer: Printer,
    stream: TextIO | None = None,
    *,
    warmup: bool = True,
    max_wall_s: float | None = None,
) -> PlainProgress:
    """A live display when ``stream`` (default stdout) is a terminal, else plain lines.

    Args:
        printer: where plain lines go (unused by the live display, which prints itself).
        stream: the output to inspect.
        warmup: whether trials warm up (``bench.warmup`` > 0).
        max_wall_s: ``study.max_wall_s``.
    """
    stream = stream if stream is not None else sys.stdout
    isatty = getattr(stream, "isatty", None)
    if not (callable(isatty) and isatty()):
        return PlainProgress(printer)
    try:
        from rich.console import Console
    except ImportError:  # an install without rich: the plain lines still work
        return PlainProgress(printer)
    console = Console(file=stream)
    if console.is_dumb_terminal:
        return PlainProgress(printer)
    return LiveProgress(console, warmup=warmup, max_wall_s=max_wall_s)


class TrialLines:
    """The finished-trial lines: restarts used of the budget, what ran and why, the pick so far;
    shown by ``sink`` (plain lines, or a live display on a terminal)."""

    def __init__(self, budget: int, used: int, sink: PlainProgress) -> None:
        self.budget = budget
        self.used = used
        self.sink = sink
        self.pick = "no pick yet"
        self.pick_view: PickView | None = None

    def set_pick(self, line: str, view: PickView | None) -> None:
        """The pick so far, from every stored trial (a resumed study's earlier ones too)."""
        self.pick, self.pick_view = line, view
        self.sink.status(used=self.used, budget=self.budget, pick=view)

    def phase(self, trial: int, phase: str) -> None:
        self.sink.phase(trial, phase)

    def finished(self, result: TrialResult, trial: TrialHandle, reused_from: int | None) -> None:
        if result.launch is None:  # reused, or refused before launch: no server started
            head = f"[no restart] trial {result.trial}"
        elif not result.costs_restart:  # lost with its node (or interrupted): the retry counts
            head = f"[not counted] trial {result.trial}"
        else:
            self.used += 1
            head = f"[restart {self.used}/{self.budget}] trial {result.trial}"
        why = f" ({trial.role or trial.reason})" if (trial.role or trial.reason) else ""
        if result.state is TrialState.COMPLETE and result.value is not None:
            what = f"{result.value:.1f} tok/s"
            acc = result.metrics.get("accept_length")
            if acc is not None and acc == acc:
                what += f", accept len {acc:.2f}"
            runs = result.metrics.get("runs")
            if runs is not None and runs == runs:
                what += f", {plural(int(runs), 'run')}"
        elif result.state is TrialState.PRUNED:
            mean = result.metrics.get("tok_s_mean", math.nan)
            what = f"pruned at {mean:.1f} tok/s ({result.failure_detail})"
        else:
            what = f"{result.state.value} ({result.failure or 'no reason'})"
        if reused_from is not None:  # no server started: the result is another trial's
            what = f"reused trial {reused_from}: {what}"
        self.sink.line(f"{head}{why}: {result.candidate.label()} -> {what}; {self.pick}")
        self.sink.status(used=self.used, budget=self.budget, pick=self.pick_view)
