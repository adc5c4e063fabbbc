"""SGLang-format log lines for the twin (``docs/sglang.md``, *Log lines*).

SGLang writes ``[%Y-%m-%d %H:%M:%S{ prefix}] text`` to stdout, where the prefix of scheduler lines
is `` TP0`` (0.5.23: only when tp_size > 1; older versions always). The HTTP-server process (ready
line, warmup errors, the sigquit handler) has no prefix. Access lines imitate uvicorn's, which
0.5.23 formats with SGLang's own ``[time] `` stamp (uvicorn's plain lines before). The
launcher redirects stdout and stderr to one file, so this is what a log classifier reads.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}

# The scheduler frames of a crash traceback, as SGLang 0.5.23 prints them (paths of a pip
# install); the last lines (the exception) are appended per failure.
_SITE = "/usr/local/lib/python3.11/site-packages"
SCHEDULER_FRAMES = (
    f'  File "{_SITE}/sglang/srt/managers/scheduler.py", line 6365, in run_scheduler_process\n'
    "    scheduler.run_event_loop()\n"
    f'  File "{_SITE}/sglang/srt/managers/scheduler.py", line 1341, in run_event_loop\n'
    "    dispatch_event_loop(self)\n"
    f'  File "{_SITE}/sglang/srt/managers/scheduler.py", line 6212, in dispatch_event_loop\n'
    "    scheduler.event_loop_overlap()\n"
)
INIT_FRAMES = (
    f'  File "{_SITE}/sglang/srt/managers/scheduler.py", line 6343, in run_scheduler_process\n'
    "    scheduler = Scheduler(\n"
    "                ^^^^^^^^^^\n"
    f'  File "{_SITE}/sglang/srt/managers/scheduler.py", line 412, in __init__\n'
    "    self.init_model_worker()\n"
    f'  File "{_SITE}/sglang/srt/model_executor/model_runner.py", line 388, in __init__\n'
    "    self.initialize(min_per_gpu_memory)\n"
)


class SglangLog:
    """Writes SGLang's log lines to a stream (stdout by default) and flushes each one.

    Args:
        version: the emulated SGLang version (decides the TP prefix rule).
        tp_size: tensor-parallel size.
        level: SGLang's ``--log-level`` name.
        http_level: ``--log-level-http`` (access lines); defaults to ``level``.
        stream: where lines go.
    """

    def __init__(
        self,
        version: tuple[int, int, int],
        tp_size: int,
        level: str = "info",
        http_level: str | None = None,
        stream: TextIO | None = None,
    ) -> None:
        self._stream = stream if stream is not None else sys.stdout
        self._level = _LEVELS.get(level.lower(), logging.INFO)
        self._http_level = _LEVELS.get((http_level or level).lower(), logging.INFO)
        show_tp = tp_size > 1 or version < (0, 5, 23)
        self._sched_prefix = " TP0" if show_tp else ""
        self._stamp_uvicorn = version >= (0, 5, 23)

    def _write(self, text: str, prefix: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self._stream.write(f"[{stamp}{prefix}] {text}\n")
        self._stream.flush()

    def server(self, text: str, level: int = logging.INFO) -> None:
        """A line of the HTTP-server / launcher process (no rank prefix)."""
        if level >= self._level:
            self._write(text, "")

    def scheduler(self, text: str, level: int = logging.INFO) -> None:
        """A line of the stats-logging scheduler rank (``TP0`` prefix per version)."""
        if level >= self._level:
            self._write(text, self._sched_prefix)

    def raw(self, text: str) -> None:
        """A line outside SGLang's logger (NCCL's own output, uvicorn's startup lines)."""
        self._stream.write(text.rstrip("\n") + "\n")
        self._stream.flush()

    def uvicorn(self, text: str) -> None:
        """A line of uvicorn's (startup, access): ``[time] INFO:     ...`` from 0.5.23."""
        line = f"INFO:     {text}"
        if self._stamp_uvicorn:
            self._write(line, "")
        else:
            self.raw(line)

    def access(self, peer: str, method: str, path: str, status: int, reason: str) -> None:
        """A uvicorn access line: ``INFO:     127.0.0.1:5 - "GET /x HTTP/1.1" 200 OK``."""
        if logging.INFO >= self._http_level:
            self.uvicorn(f'{peer} - "{method} {path} HTTP/1.1" {status} {reason}')

    def scheduler_exception(self, exception_text: str, *, during_init: bool = False) -> None:
        """``Scheduler hit an exception: <traceback>`` ending with ``exception_text``."""
        frames = INIT_FRAMES if during_init else SCHEDULER_FRAMES
        body = "Traceback (most recent call last):\n" + frames + exception_text.rstrip("\n")
        self.scheduler(f"Scheduler hit an exception: {body}\n", logging.ERROR)

    def sigquit(self) -> None:
        """The parent's reaction to a dead scheduler (engine.py)."""
        self.server(
            "Received sigquit from a child process. It usually means the child failed.",
            logging.ERROR,
        )
