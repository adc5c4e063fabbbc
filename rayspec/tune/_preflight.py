"""Checks that need more than the schema, run before anything starts (each a ConfigError)."""

from __future__ import annotations

import errno
import os
import socket
import tempfile

from rayspec._config import Engine
from rayspec._config import ExperimentConfig
from rayspec._exceptions import ConfigError
from rayspec._plural import plural
from rayspec.search import SearchSpace
from rayspec.search import validate_enqueue
from rayspec.search._study import check_grid
from rayspec.search._study import check_resumable
from rayspec.tune._node import NodeProbes
from rayspec.tune._node import check_nccl_values
from rayspec.tune._node import check_node
from rayspec.tune._node import default_probes

__all__ = ["check_output_dir", "check_port_free", "planned_local_slots", "preflight"]


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


def _writable_folder(path: str) -> str:
    """Why ``path`` cannot hold a study's files ("" when it can): its nearest existing folder
    must take a new entry. A probe folder is made there and removed again, so nothing stays
    behind and a refusal by the file system itself (``/proc``, a read-only mount, root on
    a folder ``os.access`` calls writable) is caught, not guessed."""
    folder = os.path.abspath(path)
    while not os.path.exists(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    if not os.path.isdir(folder):
        return f"{folder} is not a folder"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".rayspec-probe-", dir=folder))
    except OSError as exc:
        return f"cannot create folders in {folder} ({exc.strerror or exc})"
    return ""


def check_output_dir(cfg: ExperimentConfig) -> None:
    """The study folder (and a journal storage elsewhere) can be created and written.

    Raises:
        ConfigError: one line naming ``output.dir`` (or ``study.storage``).
    """
    why = _writable_folder(cfg.out_dir)
    if why:
        raise ConfigError(
            f"output.dir: {cfg.out_dir} cannot be created: {why}; choose a writable folder "
            "with output.dir=..."
        )
    url = cfg.storage_url
    if "://" not in url:
        why = _writable_folder(os.path.dirname(os.path.abspath(url)))
        if why:
            raise ConfigError(f"study.storage: {url} cannot be created: {why}")


def preflight(
    cfg: ExperimentConfig, *, launching: bool = True, probes: NodeProbes | None = None
) -> list[str]:
    """Raise :class:`ConfigError` for any problem found before starting Ray or a server.

    ``launching=False`` (``--dry-run``, ``--print-config``) skips what only matters when
    servers really start on this machine: free ports, SGLang, the model folders and the GPUs.
    The real engine on a local cluster gets every node check of :func:`check_node` (through
    ``probes``, default the real ones); a remote cluster's nodes are not inspected.

    Returns:
        Warnings to print; they do not stop the study.

    Raises:
        ConfigError: one line per problem (the CLI prefixes the first with ``error: ``).
    """
    space = SearchSpace.from_config(cfg.search)
    check_grid(cfg, space)
    validate_enqueue(cfg, space)
    check_resumable(cfg, space)
    if cfg.server.engine is Engine.twin:
        from rayspec.twin import load_profile

        try:
            profile = load_profile(cfg.server.twin.profile)
        except (ValueError, OSError) as exc:
            raise ConfigError(f"server.twin.profile: {exc}") from None
        gpus = profile.hardware.n_ranks
        if cfg.server.tp_size > gpus:  # the twin, like SGLang, would fail to start every trial
            raise ConfigError(
                f"server.tp_size: {cfg.server.tp_size} is more than the {plural(gpus, 'GPU')} "
                "of the "
                f"twin's node (profile {cfg.server.twin.profile}); use server.tp_size={gpus} or "
                "a profile with more ranks"
            )
    if launching:
        check_output_dir(cfg)
    local = not cfg.cluster.address
    if local and launching:
        for slot in range(planned_local_slots(cfg)):
            check_port_free(cfg.server.host, cfg.server.port + slot)
    if cfg.server.engine is not Engine.sglang:
        return []
    # NCCL values are checked for the real engine only, and on every run (a dry run too: they
    # are NCCL's rules, not this node's). The twin accepts them on purpose: it exists to
    # exercise failures, and its studies search bad values (NCCL_PROTO=LL256 in
    # tests/tune_tests/test_search.py and tests/reliability_tests/test_faults.py) to check
    # that a failing NCCL set is recorded, screened out and never launched again.
    findings = check_nccl_values(cfg)
    if local and launching:
        findings.extend(check_node(cfg, probes or default_probes()))
    if findings.problems:
        # One line per problem: the CLI prints "error: " before the message's first line.
        raise ConfigError("\nerror: ".join(findings.problems))
    return findings.warnings
