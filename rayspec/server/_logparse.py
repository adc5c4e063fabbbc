"""The reaper's exit line in a server log (a pure function).

The engine's own log lines (decode windows, the startup summary) are read by the engine
(:mod:`rayspec.engines.sglang`); this line is written by rayspec's reaper, whatever the engine.
"""

from __future__ import annotations

import re

from rayspec.server._reaper import EXIT_LINE_PREFIX

_EXIT = re.compile(r"(?m)^" + re.escape(EXIT_LINE_PREFIX) + r"(-?\d+)\s*$")


def parse_exit_status(text: str) -> int | None:
    """The server's exit status as the reaper logged it (the last such line), or None."""
    found = _EXIT.findall(text)
    return int(found[-1]) if found else None
