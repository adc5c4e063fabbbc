"""rayspec.server: start, watch, classify and tear down one server per trial.

Public names:

- :class:`BaseServerBackend` (with :class:`ServerState`), :class:`SGLangBackend`,
  :class:`TwinBackend` and :func:`backend_for`: one server process tree each.
- :class:`ServerActor`: the Ray actor that owns a backend on a node with the trial's GPUs.
- :func:`classify_failure` and :class:`Phase`: a failure's :class:`~rayspec.FailureReason`
  from SGLang's real log lines (SGLang's, from :mod:`rayspec.engines.sglang`).
- :func:`parse_decode_line`, :func:`parse_decode_lines`, :func:`parse_startup_summary`,
  :class:`DecodeBatch`, :class:`StartupSummary`: SGLang's tolerant log parsers (also from
  :mod:`rayspec.engines.sglang`); :func:`parse_exit_status`: the reaper's exit line.
- :func:`build_launch`, :func:`server_env` and :func:`shell_line`: config + candidate ->
  :class:`~rayspec.LaunchSpec` (pure; the engine object spells it), and the launch as one
  copy-pasteable shell line; :func:`tiers_json` and :data:`ADAPTIVE_CONFIG_FLAG`: a plan's
  tiers file and the flag that names it.
- :func:`start_process`, :func:`stop_process` and :class:`ProcessInfo`: the process layer.
"""

from __future__ import annotations

from rayspec.engines import DecodeBatch
from rayspec.engines import Phase
from rayspec.engines.sglang import StartupSummary
from rayspec.engines.sglang import classify_failure
from rayspec.engines.sglang import parse_decode_line
from rayspec.engines.sglang import parse_decode_lines
from rayspec.engines.sglang import parse_startup_summary
from rayspec.server._actor import ServerActor
from rayspec.server._backends import SGLangBackend
from rayspec.server._backends import TwinBackend
from rayspec.server._backends import backend_for
from rayspec.server._base import BaseServerBackend
from rayspec.server._base import ServerState
from rayspec.server._command import ADAPTIVE_CONFIG_FLAG
from rayspec.server._command import build_launch
from rayspec.server._command import server_env
from rayspec.server._command import shell_line
from rayspec.server._command import tiers_json
from rayspec.server._logparse import parse_exit_status
from rayspec.server._process import ProcessInfo
from rayspec.server._process import start_process
from rayspec.server._process import stop_process

__all__ = [
    "ADAPTIVE_CONFIG_FLAG",
    "BaseServerBackend",
    "DecodeBatch",
    "Phase",
    "ProcessInfo",
    "SGLangBackend",
    "ServerActor",
    "ServerState",
    "StartupSummary",
    "TwinBackend",
    "backend_for",
    "build_launch",
    "server_env",
    "classify_failure",
    "parse_decode_line",
    "parse_decode_lines",
    "parse_exit_status",
    "parse_startup_summary",
    "shell_line",
    "start_process",
    "stop_process",
    "tiers_json",
]
