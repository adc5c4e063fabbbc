"""The command builder: config + candidate -> :class:`~rayspec.LaunchSpec` (a pure function).

It follows SGLang's launch template for a tuning trial (docs/sglang.md, *Launch template*): every
setting with a version- or topk-dependent default is passed explicitly (attention backend,
running-request cap, decode CUDA-graph cap, memory fraction), the three speculative numbers go
together, and NVLink multicast stays off (``NCCL_NVLS_ENABLE=0`` exported) unless the experiment
allows it. The twin takes the same flags, plus ``--twin-*``.
"""

from __future__ import annotations

import hashlib
import sys

from rayspec._config import Engine
from rayspec._config import ExperimentConfig
from rayspec._text import shell_quote
from rayspec._types import Candidate
from rayspec._types import LaunchSpec
from rayspec.server._versions import sglang_features

__all__ = ["build_launch", "cuda_graph_flag", "server_env", "shell_line", "twin_seed"]

SGLANG_MODULE = "sglang.launch_server"
TWIN_MODULE = "rayspec.twin.server"
SPEC_V2_ENV = "SGLANG_ENABLE_SPEC_V2"  # False: the speculative overlap scheduler off (<0.5.18)


def cuda_graph_flag(sglang_version: str) -> str:
    """The decode CUDA-graph cap flag: renamed in 0.5.18, old name rejected from 0.5.20.

    Read from the version table in :mod:`rayspec.server._versions`.
    """
    return sglang_features(sglang_version).cuda_graph_flag


def twin_seed(study_seed: int | None, trial: int) -> int:
    """A per-trial twin seed: reproducible for a seeded study, distinct across trials."""
    digest = hashlib.sha256(f"{study_seed}:{trial}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def _overlap_switch(cfg: ExperimentConfig) -> str:
    """How this experiment's SGLang (or the version the twin emulates) turns overlap off."""
    return sglang_features(cfg.server.version).spec_v2_switch


def server_env(cfg: ExperimentConfig, candidate: Candidate) -> tuple[dict[str, str], list[str]]:
    """The variables to set and to remove for one candidate.

    Searched NCCL variables whose choice is ``unset`` are removed from the inherited
    environment, so a value left on the node never leaks into a trial.
    """
    env = dict(cfg.server.env)
    env.update(candidate.env)
    spec = candidate.spec
    if spec is not None and not spec.overlap and _overlap_switch(cfg) == "env":
        env[SPEC_V2_ENV] = "False"
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
    python = srv.python or sys.executable
    twin = srv.engine is Engine.twin
    module = TWIN_MODULE if twin else SGLANG_MODULE
    model_path = srv.model_path or (f"rayspec-twin/{srv.twin.profile}" if twin else "")
    argv: list[str] = [
        python, "-m", module,
        "--model-path", model_path,
        "--tp-size", str(srv.tp_size),
        "--host", srv.host,
        "--port", str(port),
    ]  # fmt: skip
    spec = candidate.spec
    if spec is not None:
        draft = srv.draft_model_path or (f"rayspec-twin/{srv.twin.profile}-draft" if twin else "")
        argv += [
            "--speculative-algorithm", spec.algorithm,
            "--speculative-draft-model-path", draft,
            "--speculative-num-steps", str(spec.num_steps),
            "--speculative-eagle-topk", str(spec.eagle_topk),
            "--speculative-num-draft-tokens", str(spec.num_draft_tokens),
        ]  # fmt: skip
        if spec.adaptive:  # steps move among the tiers' candidate steps from num_steps
            argv.append("--speculative-adaptive")
        if not spec.overlap and _overlap_switch(cfg) == "flag":
            argv.append("--disable-overlap-schedule")
    if srv.attention_backend:
        argv += ["--attention-backend", srv.attention_backend]
    # Explicit in both arms, so SGLang's 48 cap for speculation does not differ from the
    # baseline, and the graph cap does not follow it (docs/sglang.md, *Launch template*).
    argv += ["--max-running-requests", str(srv.max_running_requests)]
    graph_cap = srv.cuda_graph_max_bs or srv.max_running_requests
    argv += [cuda_graph_flag(srv.sglang_version), str(graph_cap)]
    if srv.mem_fraction_static is not None:
        argv += ["--mem-fraction-static", f"{srv.mem_fraction_static:g}"]
    if srv.trust_remote_code:
        argv.append("--trust-remote-code")
    if srv.enable_metrics:
        argv.append("--enable-metrics")
    argv += list(candidate.flags)
    argv += list(srv.extra_flags)
    if twin:
        seed = srv.twin.seed if srv.twin.seed is not None else twin_seed(cfg.study.seed, trial)
        argv += [
            "--twin-profile", srv.twin.profile,
            "--twin-seed", str(seed),
            "--twin-startup-s", f"{srv.twin.startup_s:g}",
            "--twin-version", srv.twin.version,
        ]  # fmt: skip
        if srv.twin.fault:
            argv += ["--twin-fault", srv.twin.fault]
    env, unset = server_env(cfg, candidate)
    return LaunchSpec(
        argv=tuple(argv),
        env=tuple(sorted(env.items())),
        host=srv.host,
        port=port,
        log_path=log_path,
        startup_timeout_s=srv.startup_timeout_s,
        engine=srv.engine.value,
        unset_env=tuple(unset),
    )


def shell_line(launch: LaunchSpec) -> str:
    """The launch as one copy-pastable shell line (for reports; never executed by rayspec)."""
    env = " ".join(f"{k}={shell_quote(v)}" for k, v in launch.env)
    unset = " ".join(f"-u {k}" for k in launch.unset_env)
    prefix = f"env {unset} " if unset else ""
    cmd = " ".join(shell_quote(a) for a in launch.argv)
    return f"{prefix}{env} {cmd}".strip()
