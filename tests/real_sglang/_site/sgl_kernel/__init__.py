"""A test-only stand-in for SGLang's kernel package ``sgl_kernel``, for its CPU path.

PyPI has no CPU build of SGLang's kernels, and SGLang imports a few of them on a CPU even without
speculation. This package is put on the SGLang env's ``PYTHONPATH`` by the real-SGLang tests
(``tests/real_sglang/``, see ``docs/real-sglang-cpu.md``) and nowhere else. It provides, in plain
PyTorch, the ops SGLang's ``intel_amx`` attention backend and its EAGLE CPU path call; a name it
lacks raises ``ImportError`` on ``from sgl_kernel import ...``, which is what SGLang's optional
imports expect of a kernel package without that op.
"""

from __future__ import annotations

from sgl_kernel import _ops  # noqa: F401  registers torch.ops.sgl_kernel.*
from sgl_kernel._attention import decode_attention_cpu
from sgl_kernel._attention import extend_attention_cpu
from sgl_kernel._kvcache import copy_all_layer_kv_cache_cpu
from sgl_kernel._spec import assign_draft_cache_locs_contiguous_cpu
from sgl_kernel._spec import assign_extend_cache_locs_cpu
from sgl_kernel._spec import assign_req_to_token_pool_cpu
from sgl_kernel._spec import build_draft_decode_metadata_cpu
from sgl_kernel._spec import build_tree_kernel_efficient_cpu
from sgl_kernel._spec import fill_accept_out_cache_loc_cpu
from sgl_kernel._spec import fill_bonus_tokens_cpu
from sgl_kernel._spec import rotate_input_ids_cpu
from sgl_kernel._spec import verify_tree_greedy_cpu

__version__ = "0.0.0+rayspec.test.stand.in"
IS_RAYSPEC_TEST_STAND_IN = True

__all__ = [
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "assign_req_to_token_pool_cpu",
    "build_draft_decode_metadata_cpu",
    "build_tree_kernel_efficient_cpu",
    "copy_all_layer_kv_cache_cpu",
    "decode_attention_cpu",
    "extend_attention_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu",
    "verify_tree_greedy_cpu",
]
