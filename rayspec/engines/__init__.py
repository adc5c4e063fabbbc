"""rayspec.engines: one object per serving engine (docs/engines.md).

Public names:

- :class:`Engine`: what rayspec needs of an engine (argv, endpoints, log reading, version rules,
  flag tables, metric keys, the version probe, the EAGLE-3 layer rules, where a pick deploys).
- :data:`SGLANG`: SGLang. :data:`TWIN`: the digital twin, SGLang's dialect run by
  ``python -m rayspec.twin.server`` (:meth:`Engine.with_process`); it deploys to SGLang.
- :func:`engine_named`: the engine of a ``server.engine`` / ``LaunchSpec.engine`` value.
- The engine's vocabulary: :class:`LaunchArgs`, :class:`Endpoints`, :class:`FlagTable`,
  :class:`MetricKeys`, :class:`Installed`, :class:`DecodeBatch`, :class:`Phase`.
- :func:`flag_name` (the flag of ``--flag=value``), :func:`shell_line` (a launch as one shell
  line) and :func:`deploy_lines` (a launch as the lines of a deploy script).

This package sits below ``_config``: it imports only the leaf modules, never the config.
"""

from __future__ import annotations

from rayspec.engines._base import DecodeBatch
from rayspec.engines._base import Endpoints
from rayspec.engines._base import Engine
from rayspec.engines._base import FlagTable
from rayspec.engines._base import Installed
from rayspec.engines._base import LaunchArgs
from rayspec.engines._base import MetricKeys
from rayspec.engines._base import Phase
from rayspec.engines._base import deploy_lines
from rayspec.engines._base import flag_name
from rayspec.engines._base import shell_line
from rayspec.engines._registry import ENGINES
from rayspec.engines._registry import TWIN
from rayspec.engines._registry import engine_named
from rayspec.engines.sglang import SGLANG

__all__ = [
    "ENGINES",
    "SGLANG",
    "TWIN",
    "DecodeBatch",
    "Endpoints",
    "Engine",
    "FlagTable",
    "Installed",
    "LaunchArgs",
    "MetricKeys",
    "Phase",
    "deploy_lines",
    "engine_named",
    "flag_name",
    "shell_line",
]
