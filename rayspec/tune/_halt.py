"""Failures that stop a study because no later trial would get past them either: the same
startup failure of two launches in a row (a broken engine install, a missing library, a
model that does not load), and a search that asks for a start that cannot happen.

Pure: the driver feeds it each recorded result and stops the study (exit 1) on the line it
returns, which names the cause as the server's log gave it.
"""

from __future__ import annotations

import re

from rayspec._exceptions import NOT_THE_CONFIG
from rayspec._exceptions import FailureReason
from rayspec._types import TrialResult
from rayspec._types import TrialState
from rayspec.search import canonical_key

__all__ = ["SameStartupFailure", "cause_line"]

# Failures before the server was ready that no other configuration is likely to get past when
# two in a row leave the same line: the engine's install or the model, not the settings. Not
# the NCCL failures (one bad NCCL value fails every set it is in: that set is refused, the
# rest run) nor the memory and graph-capture ones (a smaller configuration may fit).
STARTUP_FAILURES = frozenset(
    {
        FailureReason.STARTUP_CRASH.value,
        FailureReason.ARGUMENT_ERROR.value,
        FailureReason.NEVER_READY.value,
    }
)
# A log line's own stamp ("[2026-01-02 10:00:00 TP0] "), which differs on every launch.
_STAMP = re.compile(r"^\[[^\]]{0,80}\]\s*")
_CAUSE_CHARS = 300


def _is_exception_line(line: str) -> bool:
    """``ModuleNotFoundError: No module named 'x'``, ``torch.OutOfMemoryError: ...``."""
    head, sep, _ = line.partition(": ")
    name = head.rsplit(".", 1)[-1]
    return bool(sep) and name.isidentifier() and name.endswith(("Error", "Exception", "Exit"))


def cause_line(result: TrialResult) -> str:
    """The line of a failed server's log that says why: the last exception of its traceback,
    else an argument parser's ``error:`` line, else its last line (each without its stamp);
    the failure's own detail for a server never ready (its wait) or when the log says nothing."""
    lines = [_STAMP.sub("", ln).strip() for ln in result.log_tail.splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("[rayspec")]
    found = next((ln for ln in reversed(lines) if _is_exception_line(ln)), "")
    found = found or next((ln for ln in reversed(lines) if ": error: " in ln), "")
    if not found and result.failure == FailureReason.NEVER_READY.value:
        found = result.failure_detail.strip()  # "not ready within N s": server.startup_timeout_s
    found = found or (lines[-1] if lines else result.failure_detail.strip())
    return found[:_CAUSE_CHARS]


class SameStartupFailure:
    """Watches the launches of one invocation: the same startup failure, with the same cause
    line, of two configurations launched in a row stops the study (one configuration failing
    twice is that configuration's; a resume starts counting afresh, so a fixed install gets
    its launches)."""

    def __init__(self, logs: str) -> None:
        self.logs = logs  # the study's server logs, named in the stop line
        self._last: tuple[int, str, str, str] | None = None  # trial, reason, cause, config

    def see(self, result: TrialResult) -> str:
        """The stop line ("" to go on) after ``result`` was recorded."""
        if result.launch is None or result.failure in NOT_THE_CONFIG:
            return ""  # no server of its own (reused, refused), or not the configuration's
        if result.state is not TrialState.FAIL or result.failure not in STARTUP_FAILURES:
            self._last = None
            return ""
        cause = cause_line(result)
        now = (result.trial, str(result.failure), cause, canonical_key(result.candidate))
        last, self._last = self._last, now
        if last is None or last[1:3] != now[1:3] or last[3] == now[3]:
            return ""
        return (
            f"trials {last[0]} and {result.trial} failed the same way before their servers "
            f"were ready ({result.failure}): {cause}; no other configuration would get past "
            f"it: fix that (the servers' logs: {self.logs}), then run the same command again"
        )
