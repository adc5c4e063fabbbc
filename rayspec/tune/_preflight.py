"""Checks that need more than the schema, run before anything starts (each a ConfigError)."""

from __future__ import annotations

import errno
import os
import socket
import sys
from importlib.util import find_spec

from rayspec._config import Engine
from rayspec._config import ExperimentConfig
from rayspec._exceptions import ConfigError
from rayspec.search import SearchSpace
from rayspec.search import validate_enqueue
from rayspec.search._study import check_resumable

__all__ = ["check_port_free", "planned_local_slots", "preflight"]


def planned_local_slots(cfg: ExperimentConfig) -> int:
    """Concurrent trials on a local cluster (each needs its own port)."""
    return max(1, cfg.cluster.max_concurrent_trials)


def check_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(
                    f"server.port: {port} on {host} is already in use; free it or choose "
                    f"another with server.port=..."
                ) from None
            raise ConfigError(
                f"server.host: cannot listen on {host}:{port} ({exc.strerror})"
            ) from None


def preflight(cfg: ExperimentConfig, *, launching: bool = True) -> None:
    """Raise :class:`ConfigError` for any problem found before starting Ray or a server.

    ``launching=False`` (``--dry-run``, ``--print-config``) skips what only matters when
    servers really start on this machine: free ports and an installed SGLang.
    """
    space = SearchSpace.from_config(cfg.search)
    validate_enqueue(cfg, space)
    check_resumable(cfg, space)
    if cfg.server.engine is Engine.twin:
        from rayspec.twin import load_profile

        try:
            load_profile(cfg.server.twin.profile)
        except (ValueError, OSError) as exc:
            raise ConfigError(f"server.twin.profile: {exc}") from None
    local = not cfg.cluster.address
    if local and launching:
        for slot in range(planned_local_slots(cfg)):
            check_port_free(cfg.server.host, cfg.server.port + slot)
        srv = cfg.server
        if srv.engine is Engine.sglang and not srv.python and find_spec("sglang") is None:
            # Every trial would die at import: say so once, before a study of failures.
            raise ConfigError(
                f"server.engine: sglang is not installed for {sys.executable}; install it on "
                "the GPU node (pip install 'rayspec[sglang]') or set server.python to the "
                "interpreter that has it"
            )
        if srv.engine is Engine.sglang:
            for key, path in (
                ("server.model_path", srv.model_path),
                ("server.draft_model_path", srv.draft_model_path),
            ):
                looks_local = path.startswith(("/", "./", "../", "~"))
                if path and looks_local and not os.path.exists(os.path.expanduser(path)):
                    raise ConfigError(f"{key}: {path} does not exist on this node")
