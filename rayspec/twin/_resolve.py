"""SGLang's argument resolution (``docs/sglang.md``, *Defaults that depend on the GPU*, *Flags
rayspec keeps out*, *Speculative rules*), for the twin.

:func:`resolve_server_args` applies SGLang's rules in SGLang's order (cuda-graph and memory
defaults, attention backend, page size, then speculative decoding) and raises the very exception
types SGLang raises for bad combinations, so a launcher sees the same failure at the same time:

- ``ValueError: Unknown speculative algorithm name: FOO``;
- a bare ``AssertionError`` for topk and/or draft tokens without steps;
- ``TypeError: '>' not supported between instances of 'NoneType' and 'int'`` for steps without
  topk;
- ``ValueError`` for trtllm_mha with topk > 1 and for paged trees on other backends.

A draft tree SGLang cannot run (a budget past the tree's nodes, or short of its accepted path) is
*not* an error here (SGLang does not check it either); the resolution reports it in
:attr:`Resolution.tree_error` and the engine fails at the first decode.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping
from typing import Any

from rayspec._drafttree import tree_refusal
from rayspec._types import SpecSettings
from rayspec.twin._adaptive import candidate_steps
from rayspec.twin._adaptive import load_tiers

# Algorithms SGLang 0.5.23 knows (spec_info.py), and those the twin can simulate.
KNOWN_ALGORITHMS = (
    "EAGLE",
    "EAGLE3",
    "NEXTN",
    "STANDALONE",
    "NGRAM",
    "DFLASH",
    "DSPARK",
    "UNO",
    "FROZEN_KV_MTP",
)
SIMULATED_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE")

TOPK1_WARNING = (
    "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
    "speculative_eagle_topk == 1"
)
NON_OVERLAP_WARNING = (
    "Non-overlap (synchronous) spec v2 is used for eagle/eagle3/standalone speculative decoding."
)
MAX_RUNNING_WARNING = (
    "Max running requests is reset to 48 for speculative decoding. You can override this by "
    "explicitly setting --max-running-requests."
)
CUDA_GRAPH_DEPRECATION = (
    "'--disable-cuda-graph' is deprecated and will be removed in a future release. Use "
    "'--cuda-graph-backend-{decode,prefill}=disabled' instead."
)
CUDA_GRAPH_MAX_BS_DEPRECATION = (
    "'--cuda-graph-max-bs' is deprecated. Use '--cuda-graph-max-bs-decode' instead."
)

# Without speculation SGLang derives the cap from the request pool; the twin uses this constant.
DEFAULT_MAX_RUNNING_NO_SPEC = 4096
# A 96 GB PCIe card (RTX PRO 6000 class), the reference profile's assumed GPU.
DEFAULT_GPU_MEM_MIB = 97887
DEFAULT_CONTEXT_LEN = 262144

_MEMORY_TABLE = (  # (upper bound GiB, chunked_prefill_size, max bs tp<4, max bs tp>=4)
    (20, 2048, 8, 8),
    (35, 4096, 48, 160),
    (60, 4096, 32, 160),
    (90, 8192, 256, 512),
    (160, 8192, 256, 512),
)


@dataclasses.dataclass(frozen=True)
class Resolution:
    """The effective server arguments after SGLang's rules.

    Attributes:
        args: every argument with its effective value (what ``/server_info`` reports).
        spec: the speculative settings, or None without speculation.
        warnings: log lines SGLang prints while resolving, in order.
        tree_error: SGLang's error for a draft tree it cannot run (fails at the first decode).
        env_updates: SGLang's own environment writes (*Flags rayspec keeps out*), applied
            before NCCL is read.
        adaptive_tiers: the adaptive steps' tiers (batch size -> settings) when
            ``spec.adaptive``; None otherwise.
    """

    args: Mapping[str, Any]
    spec: SpecSettings | None
    warnings: tuple[str, ...]
    tree_error: str | None
    env_updates: Mapping[str, str]
    adaptive_tiers: Mapping[int, Mapping[str, Any]] | None = None

    @property
    def max_running_requests(self) -> int:
        return int(self.args["max_running_requests"])


def _auto_spec_params(architecture: str, version: tuple[int, int, int]) -> tuple[int, int, int]:
    """SGLang's ``_auto_choose_speculative_params`` by target architecture (*Speculative
    rules*)."""
    if architecture in ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1ModelForCausalLM"):
        return 5, 4, 8
    deepseek_like = ("Deepseek", "GptOss", "Glm4Moe", "BailingMoe", "MiMoV2", "KimiK25")
    if version >= (0, 5, 12) or architecture.startswith(deepseek_like):
        return 3, 1, 4
    return 5, 4, 8


def _memory_defaults(gpu_mem_mib: int, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, decode cuda-graph max bs) from SGLang's GPU-memory table."""
    gib = gpu_mem_mib / 1024
    for bound, chunk, bs_small, bs_large in _MEMORY_TABLE:
        if gib < bound:
            return chunk, bs_small if tp < 4 else bs_large
    return 16384, 512


def sglang_env_updates(
    ns: argparse.Namespace, env: Mapping[str, str], version: tuple[int, int, int]
) -> dict[str, str]:
    """The environment writes of ``engine.py`` (*Flags rayspec keeps out*), as a dict of new
    values."""
    updates = {"CUDA_DEVICE_MAX_CONNECTIONS": "8"}
    if ns.enable_nccl_nvls or ns.enable_symm_mem:
        updates["NCCL_NVLS_ENABLE"] = "1"
    elif version >= (0, 5, 23):
        if "NCCL_NVLS_ENABLE" not in env:
            updates["NCCL_NVLS_ENABLE"] = "0"
    else:
        updates["NCCL_NVLS_ENABLE"] = str(int(bool(ns.enable_nccl_nvls)))
    if version < (0, 5, 12):
        updates["NCCL_CUMEM_ENABLE"] = "0"
    elif version < (0, 5, 23) or "NCCL_CUMEM_ENABLE" not in env:
        updates["NCCL_CUMEM_ENABLE"] = str(int(bool(ns.enable_symm_mem)))
    return updates


def resolve_server_args(
    ns: argparse.Namespace,
    *,
    architecture: str,
    gpu_mem_mib: int = DEFAULT_GPU_MEM_MIB,
    context_len: int = DEFAULT_CONTEXT_LEN,
    env: Mapping[str, str] | None = None,
) -> Resolution:
    """Apply SGLang's resolution rules to parsed arguments.

    Args:
        ns: the namespace from :func:`rayspec.twin._args.parse_args`.
        architecture: the target's ``architectures[0]`` (drives the automatic spec parameters).
        gpu_mem_mib: GPU memory of one card, for the memory-table defaults.
        context_len: the model's context length when ``--context-length`` is not given.
        env: the process environment (for SGLang's own environment writes).

    Returns:
        The effective arguments.

    Raises:
        ValueError: unknown algorithm, trtllm_mha with topk > 1, paged tree on a backend that
            cannot do it (SGLang's messages).
        AssertionError: topk and/or draft tokens given without steps.
        TypeError: steps given without topk.
    """
    version: tuple[int, int, int] = ns.twin_version_tuple
    args: dict[str, Any] = {
        k: v for k, v in vars(ns).items() if not k.startswith("twin_") or k == "twin_version"
    }
    warnings: list[str] = []
    if ns.disable_cuda_graph and version >= (0, 5, 23):
        warnings.append(CUDA_GRAPH_DEPRECATION)

    # 1. cuda graph and memory defaults (before the speculative rules: the 48 cap does not
    #    lower the graph size).
    tp = ns.tp_size
    chunk_default, bs_default = _memory_defaults(gpu_mem_mib, tp)
    max_bs = ns.cuda_graph_max_bs_decode
    if max_bs is None:
        max_bs = bs_default
        if ns.max_running_requests is not None:
            max_bs = min(max_bs, ns.max_running_requests)
    args["cuda_graph_max_bs_decode"] = max_bs
    if args.get("chunked_prefill_size") is None:
        args["chunked_prefill_size"] = chunk_default
    graph_disabled = bool(
        ns.disable_cuda_graph
        or getattr(ns, "disable_decode_cuda_graph", False)
        or getattr(ns, "cuda_graph_backend_decode", None) == "disabled"
    )
    args["cuda_graph_decode_enabled"] = not graph_disabled
    if ns.mem_fraction_static is None:
        reserved = 512 + 1.5 * max(args["chunked_prefill_size"], 2048) + tp * ns.pp_size / 8 * 1024
        reserved += 2 * max_bs
        if gpu_mem_mib > 60 * 1024:
            reserved = max(reserved, 10240)
        args["mem_fraction_static"] = round((gpu_mem_mib - reserved) / gpu_mem_mib, 3)
    args["context_length"] = ns.context_length or context_len

    # 2. attention backend and page size: decided while topk is still the operator's value.
    topk_given = ns.speculative_eagle_topk
    page_size = ns.page_size if ns.page_size is not None else 1
    args["page_size"] = page_size
    if ns.attention_backend is None:
        no_spec_or_topk_one = topk_given is None or (topk_given == 1 and page_size == 1)
        args["attention_backend"] = "fa3" if no_spec_or_topk_one else "flashinfer"

    # 3. speculative decoding.
    spec: SpecSettings | None = None
    tree_error: str | None = None
    adaptive_tiers: dict[int, dict[str, Any]] | None = None
    if ns.speculative_algorithm is None:
        if ns.max_running_requests is None:
            args["max_running_requests"] = DEFAULT_MAX_RUNNING_NO_SPEC
    else:
        algo = ns.speculative_algorithm.upper()
        if algo not in KNOWN_ALGORITHMS:
            raise ValueError(f"Unknown speculative algorithm name: {ns.speculative_algorithm}")
        if algo == "NEXTN":
            algo = "EAGLE"
        args["speculative_algorithm"] = algo
        if ns.max_running_requests is None:
            args["max_running_requests"] = 48
            warnings.append(MAX_RUNNING_WARNING)
        steps = ns.speculative_num_steps
        topk = ns.speculative_eagle_topk
        ndt = ns.speculative_num_draft_tokens
        if getattr(ns, "speculative_adaptive", False):
            # Before the eagle-family rules, as in speculative_hook.py (:261-264, :1374-1427).
            reason = _adaptive_unsupported(algo, topk)
            if reason is not None:
                warnings.append(
                    f"speculative_adaptive disabled: {reason}. "
                    "Falling back to static speculative params."
                )
            else:
                tiers = load_tiers(ns.speculative_adaptive_config)
                union = candidate_steps(tiers)
                topk = 1 if topk is None else topk
                steps = union[len(union) // 2] if steps is None else steps
                if steps not in union:
                    raise ValueError(
                        f"--speculative-num-steps={steps} is not in the adaptive config "
                        f"candidate_steps {union}. Pass one of those values."
                    )
                ndt = steps + 1
                adaptive_tiers = tiers
        if steps is None:
            if topk is not None or ndt is not None:
                raise AssertionError  # SGLang's bare assert (rule 6); explicit so -O keeps it
            steps, topk, ndt = _auto_spec_params(architecture, version)
        topk_gt_one = topk > 1  # TypeError when steps came without topk (rule 11)
        if "trtllm_mha" in str(args["attention_backend"]) and topk_gt_one:
            raise ValueError("trtllm_mha backend only supports topk = 1 for speculative decoding.")
        if topk == 1 and ndt != steps + 1:
            warnings.append(TOPK1_WARNING)
            ndt = steps + 1
        if ndt is None:  # steps + topk > 1 without draft tokens: unverified in SGLang
            raise TypeError("unsupported operand type(s) for -: 'NoneType' and 'int'")
        if (
            topk_gt_one
            and page_size > 1
            and args["attention_backend"] not in ("flashinfer", "fa3", "triton")
        ):
            raise ValueError(
                "speculative_eagle_topk > 1 with page_size > 1 is only supported by the "
                "flashinfer, fa3 and triton attention backends."
            )
        args["speculative_num_steps"] = steps
        args["speculative_eagle_topk"] = topk
        args["speculative_num_draft_tokens"] = ndt
        # The speculative overlap scheduler exists for topk 1 only (docs/sglang.md,
        # *Versions*): off with --disable-overlap-schedule, or SGLANG_ENABLE_SPEC_V2=False before
        # 0.5.18.
        overlap = topk > 1 or not _overlap_disabled(ns, env or {}, version)
        if not overlap and version >= (0, 5, 23):
            warnings.append(NON_OVERLAP_WARNING)
        spec = SpecSettings(
            algo, steps, topk, ndt, adaptive=adaptive_tiers is not None, overlap=overlap
        )
        refusal = tree_refusal(spec)
        if refusal is not None:
            tree_error = refusal.removeprefix("RuntimeError: ")
        if algo not in SIMULATED_ALGORITHMS:
            raise NotImplementedError(
                f"rayspec twin: speculative algorithm {algo} is valid in SGLang but is not "
                f"simulated (simulated: {', '.join(SIMULATED_ALGORITHMS)}, NEXTN)"
            )

    env_updates = sglang_env_updates(ns, env or {}, version)
    return Resolution(
        args=args,
        spec=spec,
        warnings=tuple(warnings),
        tree_error=tree_error,
        env_updates=env_updates,
        adaptive_tiers=adaptive_tiers,
    )


def _adaptive_unsupported(algo: str, topk: int | None) -> str | None:
    """Why SGLang turns ``--speculative-adaptive`` off (adaptive_unsupported_reason)."""
    if algo not in ("EAGLE", "EAGLE3"):
        return f"speculative_algorithm={algo} (only EAGLE/EAGLE3 are supported)"
    if topk is not None and topk != 1:
        return f"speculative_eagle_topk={topk} (only topk=1 is supported)"
    return None


def _overlap_disabled(
    ns: argparse.Namespace, env: Mapping[str, str], version: tuple[int, int, int]
) -> bool:
    if ns.disable_overlap_schedule:
        return True
    if (0, 5, 5) <= version < (0, 5, 18):
        return env.get("SGLANG_ENABLE_SPEC_V2", "").lower() in ("0", "false")
    return False
