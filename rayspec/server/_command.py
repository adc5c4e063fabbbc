"""The command builder: config + candidate -> :class:`~rayspec.LaunchSpec` (a pure function).

The experiment is read here and handed to the engine (:mod:`rayspec.engines`) in primitives:
the engine spells the launch (docs/sglang.md, *Launch template*), this module decides what the
launch holds: the searched settings (a searched scheduler knob replaces its ``server.*`` value),
the experiment's fixed flags, NVLink multicast off
(``NCCL_NVLS_ENABLE=0`` exported) unless the experiment allows it, and for the twin its
``--twin-*`` flags.
"""

from __future__ import annotations

import hashlib
import json
import sys

from rayspec._config import Engine
from rayspec._config import ExperimentConfig
from rayspec._types import Candidate
from rayspec._types import LaunchSpec
from rayspec.engines import LaunchArgs
from rayspec.engines import engine_named
from rayspec.engines import shell_line

__all__ = [
    "ADAPTIVE_CONFIG_FLAG",
    "build_launch",
    "server_env",
    "shell_line",
    "tiers_json",
    "twin_seed",
]

ADAPTIVE_CONFIG_FLAG = "--speculative-adaptive-config"


def tiers_json(tiers: tuple[tuple[int, tuple[int, ...]], ...]) -> str:
    """SGLang's adaptive config for ``tiers``: ``{"<batch size>": {"candidate_steps": [...]}}``."""
    body = {str(bs): {"candidate_steps": list(steps)} for bs, steps in tiers}
    return json.dumps(body, indent=2) + "\n"


def twin_seed(study_seed: int | None, trial: int) -> int:
    """A per-trial twin seed: reproducible for a seeded study, distinct across trials."""
    digest = hashlib.sha256(f"{study_seed}:{trial}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def _launch_args(
    cfg: ExperimentConfig, candidate: Candidate, *, port: int, trial: int
) -> LaunchArgs:
    """What the engine needs of the experiment for one launch."""
    srv = cfg.server
    twin = srv.engine is Engine.twin
    knobs = candidate.knobs
    extra = [*candidate.flags, *srv.extra_flags]
    max_running = knobs.get("max_running_requests", srv.max_running_requests)
    # The graph cap follows a searched running cap unless it is searched or fixed itself.
    graph_bs = knobs.get("cuda_graph_max_bs", srv.cuda_graph_max_bs or max_running)
    if twin:
        seed = srv.twin.seed if srv.twin.seed is not None else twin_seed(cfg.study.seed, trial)
        extra += [
            "--twin-profile", srv.twin.profile,
            "--twin-seed", str(seed),
            "--twin-startup-s", f"{srv.twin.startup_s:g}",
            "--twin-version", srv.twin.version,
        ]  # fmt: skip
        if srv.twin.fault:
            extra += ["--twin-fault", srv.twin.fault]
    return LaunchArgs(
        python=srv.python or sys.executable,
        model_path=srv.model_path or (f"rayspec-twin/{srv.twin.profile}" if twin else ""),
        draft_model_path=(
            srv.draft_model_path or (f"rayspec-twin/{srv.twin.profile}-draft" if twin else "")
        ),
        tp_size=srv.tp_size,
        host=srv.host,
        port=port,
        spec=candidate.spec,
        attention_backend=srv.attention_backend,
        max_running_requests=max_running,
        cuda_graph_max_bs=graph_bs,
        mem_fraction_static=srv.mem_fraction_static,
        chunked_prefill_size=knobs.get("chunked_prefill_size"),
        trust_remote_code=srv.trust_remote_code,
        enable_metrics=srv.enable_metrics,
        version=srv.version,
        spelling_version=srv.sglang_version,
        extra=tuple(extra),
    )


def server_env(cfg: ExperimentConfig, candidate: Candidate) -> tuple[dict[str, str], list[str]]:
    """The variables to set and to remove for one candidate.

    Searched NCCL variables whose choice is ``unset`` are removed from the inherited
    environment, so a value left on the node never leaks into a trial.
    """
    engine = engine_named(cfg.server.engine.value)
    env = dict(cfg.server.env)
    env.update(candidate.env)
    env.update(engine.launch_env(_launch_args(cfg, candidate, port=cfg.server.port, trial=0)))
    if not cfg.server.allow_nvlink_multicast:
        env["NCCL_NVLS_ENABLE"] = "0"
    unset = sorted(name for name in cfg.search.nccl if name not in env)
    return env, unset


def build_launch(
    cfg: ExperimentConfig,
    candidate: Candidate,
    *,
    port: int,
    log_path: str,
    trial: int = 0,
) -> LaunchSpec:
    """Build the exact launch of ``candidate``.

    Args:
        cfg: the experiment.
        candidate: the searched settings.
        port: the port this server listens on.
        log_path: the file that receives the server's output.
        trial: the trial number (seeds the twin).

    Returns:
        The argv (no shell), environment and metadata of the server process.
    """
    srv = cfg.server
    engine = engine_named(srv.engine.value)
    argv = engine.launch_argv(_launch_args(cfg, candidate, port=port, trial=trial))
    env, unset = server_env(cfg, candidate)
    return LaunchSpec(
        argv=argv,
        env=tuple(sorted(env.items())),
        host=srv.host,
        port=port,
        log_path=log_path,
        startup_timeout_s=srv.startup_timeout_s,
        engine=engine.name,
        unset_env=tuple(unset),
        # A plan's tiers: written on the node, never part of a command line.
        files=(
            ((ADAPTIVE_CONFIG_FLAG, tiers_json(candidate.adaptive_tiers)),)
            if candidate.adaptive_tiers and candidate.spec is not None
            else ()
        ),
    )
