"""SGLang's launch line for a tuning trial: :class:`~rayspec.engines.LaunchArgs` -> argv.

It follows SGLang's launch template (docs/sglang.md, *Launch template*): every setting with a
version- or topk-dependent default is passed explicitly (attention backend, running-request cap,
decode CUDA-graph cap, memory fraction), the three speculative numbers go together, and the
speculative overlap scheduler is turned off the way the version turns it off.
"""

from __future__ import annotations

from rayspec.engines._base import LaunchArgs
from rayspec.engines.sglang._versions import sglang_features

__all__ = ["SPEC_V2_ENV", "cuda_graph_flag", "sglang_argv", "sglang_env"]

SPEC_V2_ENV = "SGLANG_ENABLE_SPEC_V2"  # False: the speculative overlap scheduler off (<0.5.18)


def cuda_graph_flag(sglang_version: str) -> str:
    """The decode CUDA-graph cap flag: renamed in 0.5.18, old name rejected from 0.5.20.

    Read from the version table in :mod:`rayspec.engines.sglang._versions`.
    """
    return sglang_features(sglang_version).cuda_graph_flag


def sglang_argv(module: str, args: LaunchArgs) -> tuple[str, ...]:
    """``python -m <module>`` with SGLang's flags for ``args``, ``args.extra`` last."""
    argv: list[str] = [
        args.python, "-m", module,
        "--model-path", args.model_path,
        "--tp-size", str(args.tp_size),
        "--host", args.host,
        "--port", str(args.port),
    ]  # fmt: skip
    spec = args.spec
    if spec is not None:
        argv += [
            "--speculative-algorithm", spec.algorithm,
            "--speculative-draft-model-path", args.draft_model_path,
            "--speculative-num-steps", str(spec.num_steps),
            "--speculative-eagle-topk", str(spec.eagle_topk),
            "--speculative-num-draft-tokens", str(spec.num_draft_tokens),
        ]  # fmt: skip
        if spec.adaptive:  # steps move among the tiers' candidate steps from num_steps
            argv.append("--speculative-adaptive")
        if not spec.overlap and sglang_features(args.version).spec_v2_switch == "flag":
            argv.append("--disable-overlap-schedule")
    if args.attention_backend:
        argv += ["--attention-backend", args.attention_backend]
    # Explicit in both arms, so SGLang's 48 cap for speculation does not differ from the
    # baseline, and the graph cap does not follow it (docs/sglang.md, *Launch template*).
    argv += ["--max-running-requests", str(args.max_running_requests)]
    argv += [cuda_graph_flag(args.spelling_version), str(args.cuda_graph_max_bs)]
    if args.mem_fraction_static is not None:
        argv += ["--mem-fraction-static", f"{args.mem_fraction_static:g}"]
    if args.chunked_prefill_size is not None:  # searched (search.scheduler); -1: chunking off
        argv += ["--chunked-prefill-size", str(args.chunked_prefill_size)]
    if args.trust_remote_code:
        argv.append("--trust-remote-code")
    if args.enable_metrics:
        argv.append("--enable-metrics")
    argv += args.extra
    return tuple(argv)


def sglang_env(args: LaunchArgs) -> dict[str, str]:
    """SGLang's own variables of the launch: spec v2 off by environment before 0.5.18."""
    spec = args.spec
    if spec is not None and not spec.overlap:
        if sglang_features(args.version).spec_v2_switch == "env":
            return {SPEC_V2_ENV: "False"}
    return {}
