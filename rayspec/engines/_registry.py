"""The engines rayspec runs, by the name ``server.engine`` and ``LaunchSpec.engine`` give."""

from __future__ import annotations

from rayspec.engines._base import Engine
from rayspec.engines.sglang import SGLANG

__all__ = ["ENGINES", "TWIN", "engine_named"]

#: The digital twin: SGLang's flags, API and logs, run by another process. A twin study's pick
#: deploys to SGLang.
TWIN: Engine = SGLANG.with_process("twin", "rayspec.twin.server")

#: Every engine, by name (an explicit allow-list).
ENGINES: dict[str, Engine] = {SGLANG.name: SGLANG, TWIN.name: TWIN}


def engine_named(name: str) -> Engine:
    """The engine called ``name``.

    Raises:
        KeyError: no engine has that name (the message lists those that exist).
    """
    try:
        return ENGINES[name]
    except KeyError:
        raise KeyError(
            f"unknown server engine {name!r}; expected one of {sorted(ENGINES)}"
        ) from None
