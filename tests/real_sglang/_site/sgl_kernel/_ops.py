"""``torch.ops.sgl_kernel.{decode,extend}_attention_cpu``: SGLang's ``intel_amx`` backend calls
the attention ops through the torch dispatcher, so they are registered there too, with the
argument lists the installed backend passes (positionally)."""

from __future__ import annotations

import torch

from sgl_kernel._attention import decode_attention_cpu
from sgl_kernel._attention import extend_attention_cpu

_DECODE = (
    "decode_attention_cpu(Tensor query, Tensor(a!) k_buffer, Tensor(b!) v_buffer, "
    "float k_scale, float v_scale, Tensor(c!) output, Tensor? key, Tensor? value, Tensor loc, "
    "Tensor(d!) attn_logits, Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, "
    "float sm_scale, float logit_cap, bool is_cross_attn, int sliding_window_size, "
    "Tensor? encoder_lens, Tensor? sinks) -> ()"
)
_EXTEND = (
    "extend_attention_cpu(Tensor q_extend, Tensor? k_extend, Tensor? v_extend, "
    "Tensor(a!) o_extend, Tensor k_buffer, Tensor v_buffer, float k_scale, float v_scale, "
    "Tensor req_to_token, Tensor req_pool_indices, Tensor seq_lens, Tensor extend_seq_lens, "
    "Tensor extend_start_loc, int max_len_extend, float sm_scale, float logit_cap, "
    "bool is_cross_attn, int sliding_window_size, Tensor? encoder_lens, Tensor? sinks, "
    "Tensor? tree_mask, bool is_causal) -> ()"
)

_LIB = torch.library.Library("sgl_kernel", "FRAGMENT")
_LIB.define(_DECODE)
_LIB.define(_EXTEND)
_LIB.impl("decode_attention_cpu", decode_attention_cpu, "CPU")
_LIB.impl("extend_attention_cpu", extend_attention_cpu, "CPU")
