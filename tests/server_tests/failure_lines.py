"""SGLang's real failure texts (docs/sglang.md, *Speculative rules*, *Failure texts*; docs/twin-
model.md, *NCCL variables*).

Shared by the classifier tests and the fake server, so both use exactly the same lines:
name -> (log text, exit status, expected reason value when the server exits before ready).
"""

from __future__ import annotations

_TB = (
    "[2026-11-29 12:00:01 TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
    '  File "/sgl/python/sglang/srt/managers/scheduler.py", line 6372, in run_scheduler_process\n'
)
_SIGQUIT = (
    "[2026-11-29 12:00:02] Received sigquit from a child process. It usually means the child "
    "failed.\n"
)

LINES: dict[str, tuple[str, int, str]] = {
    "torch_oom": (
        _TB + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has "
        "a total capacity of 79.11 GiB of which 1.06 GiB is free.\n" + _SIGQUIT,
        1,
        "out_of_memory",
    ),
    "kv_pool": (
        _TB + "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
        "Current value: mem_fraction_static=0.5\n" + _SIGQUIT,
        1,
        "out_of_memory",
    ),
    "graph_capture": (
        _TB + "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate "
        "512.00 MiB.\nPossible solutions:\n1. set --mem-fraction-static to a smaller value "
        "(e.g., 0.8 or 0.7)\n2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
        "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled\n" + _SIGQUIT,
        1,
        "cuda_graph_capture",
    ),
    "draft_tree": (
        _TB + "RuntimeError: selected index k out of range\n"
        "[2026-11-29 12:00:03] Initialization failed. warmup error: Traceback ...\n",
        1,
        "invalid_draft_tree",
    ),
    # docs/landscapes.md: 5 steps, topk 2, 4 draft tokens on SGLang 0.5.23 (the tree verify's
    # _compact_accept_to_front), at the warm-up's first verify.
    "draft_tree_path": (
        _TB + '  File "/sgl/python/sglang/srt/speculative/eagle_worker_common.py", line 543, in '
        "_compact_accept_to_front\n"
        "RuntimeError: The expanded size of the tensor (4) must match the existing size (6) at "
        "non-singleton dimension 1.  Target sizes: [1, 4, 2048].  Tensor sizes: [1, 6, 2048]\n"
        "[2026-11-29 12:00:03] Initialization failed. warmup error: Traceback ...\n",
        1,
        "invalid_draft_tree",
    ),
    "nccl_init": (
        _TB + "torch.distributed.DistBackendError: NCCL error in: /pytorch/torch/csrc/distributed/"
        "c10d/ProcessGroupNCCL.cpp:3356, invalid usage (run with NCCL_DEBUG=WARN for details), "
        "NCCL version 2.27.3\nncclInvalidUsage: This usually reflects invalid usage of NCCL "
        "library.\n" + _SIGQUIT,
        1,
        "nccl_init",
    ),
    "nccl_first_collective": (
        "node:1234:1234 [0] NCCL WARN Error : no algorithm/protocol available for function "
        "AllReduce with datatype ncclBfloat16. NCCL_ALGO was set to NVLS.\n"
        + _TB
        + "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:3356, "
        "invalid usage (run with NCCL_DEBUG=WARN for details), NCCL version 2.27.3\n"
        "ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n" + _SIGQUIT,
        1,
        "nccl_first_collective",
    ),
    "argparse": (
        "usage: launch_server.py [-h] --model-path MODEL_PATH [--tp-size TP_SIZE] ...\n"
        "launch_server.py: error: unrecognized arguments: --speculative-num-stepz 3\n",
        2,
        "argument_error",
    ),
    "ambiguous_option": (
        "usage: launch_server.py [-h] ...\n"
        "launch_server.py: error: ambiguous option: --cuda-graph-max-bs could match "
        "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill\n",
        2,
        "argument_error",
    ),
    "unknown_spec_algorithm": (
        "Traceback (most recent call last):\n"
        "ValueError: Unknown speculative algorithm name: FOO\n",
        1,
        "argument_error",
    ),
    "partial_spec_flags": (
        "Traceback (most recent call last):\n"
        "TypeError: '>' not supported between instances of 'NoneType' and 'int'\n",
        1,
        "argument_error",
    ),
    # Real SGLang 0.5.23 on a CPU, --speculative-draft-model-path naming a folder that is gone:
    # argument resolution takes the path for a hub id (speculative_hook.py:93, get_config).
    "missing_draft_path": (
        '  File ".../sglang/srt/arg_groups/speculative_hook.py", line 93, in '
        "_resolve_speculative_algorithm_alias\n"
        "    cfg = get_config(\n"
        "OSError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': "
        "'/tmp/real-study/draft'. Use `repo_type` argument if needed.\n",
        1,
        "argument_error",
    ),
    # transformers' wording for a name that is neither a folder nor a hub id it can reach.
    "missing_model_path": (
        "OSError: /models/kimi-k2.5-eagle3 is not a local folder and is not a valid model "
        "identifier listed on 'https://huggingface.co/models'\n",
        1,
        "argument_error",
    ),
    "plain_crash": (
        _TB + "ValueError: something nobody anticipated\n" + _SIGQUIT,
        1,
        "startup_crash",
    ),
}
