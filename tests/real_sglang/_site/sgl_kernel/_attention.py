"""Paged decode and extend attention of SGLang's ``intel_amx`` backend, in plain PyTorch.

The real kernels (``sgl-kernel/csrc/cpu/decode.cpp``, ``extend.cpp``) are fused, blocked and
vectorised; these compute the same thing the obvious way, in float32, one sequence at a time:

* decode: first store the new ``key``/``value`` rows at ``loc`` (the backend leaves that to the
  kernel), then each query row attends to its request's ``seq_len`` cached tokens, which
  ``req_to_token[req_pool_indices[b], :seq_len]`` names.
* extend: a request's new tokens attend to its cached prefix (``seq_len - extend_len`` tokens
  read from the pool) and to the new tokens themselves (from ``k_extend``/``v_extend``), causally,
  or through ``tree_mask`` when EAGLE verifies a token tree. ``tree_mask`` is the QLEN_ONLY
  layout: ``[batch, qlen, qlen]`` booleans, row = query draft token, column = key draft token;
  the prefix is always visible.

Features the tiny Llama models of the tests never use (sliding windows, attention sinks,
cross-attention, encoder lengths, FP8 caches) raise ``NotImplementedError`` rather than being
guessed.
"""

from __future__ import annotations

import torch


def _unsupported(what: str) -> NotImplementedError:
    return NotImplementedError(f"the test stand-in for sgl_kernel does not implement {what}")


def _check_plain(
    k_buffer: torch.Tensor,
    is_cross_attn: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
) -> None:
    if is_cross_attn:
        raise _unsupported("cross-attention")
    if sliding_window_size > 0:
        raise _unsupported("sliding-window attention")
    if encoder_lens is not None:
        raise _unsupported("encoder lengths")
    if sinks is not None:
        raise _unsupported("attention sinks")
    if k_buffer.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        raise _unsupported("FP8 KV caches")


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """``q`` [M, H, D] over ``k`` [N, Hkv, D] and ``v`` [N, Hkv, Dv]; ``mask`` [M, N]: True =
    visible."""
    group = q.shape[1] // k.shape[1]
    k = k.float().repeat_interleave(group, dim=1)
    v = v.float().repeat_interleave(group, dim=1)
    scores = torch.einsum("mhd,nhd->hmn", q.float(), k) * sm_scale
    if logit_cap > 0:
        scores = logit_cap * torch.tanh(scores / logit_cap)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hmn,nhd->mhd", probs, v)


def decode_attention_cpu(
    query: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    k_scale: float,
    v_scale: float,
    output: torch.Tensor,
    key: torch.Tensor | None,
    value: torch.Tensor | None,
    loc: torch.Tensor,
    attn_logits: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    is_cross_attn: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
) -> None:
    """One new token per sequence; writes ``output`` [num_seqs, H, Dv] (and the new K/V rows)."""
    _check_plain(k_buffer, is_cross_attn, sliding_window_size, encoder_lens, sinks)
    if key is not None and value is not None:
        k_buffer[loc] = key.to(k_buffer.dtype)
        v_buffer[loc] = value.to(v_buffer.dtype)
    for b in range(seq_lens.shape[0]):
        length = int(seq_lens[b])
        rows = req_to_token[int(req_pool_indices[b]), :length].long()
        out = _attend(
            query[b : b + 1], k_buffer[rows] * k_scale, v_buffer[rows], sm_scale, logit_cap, None
        )
        output[b] = (out[0] * v_scale).to(output.dtype)


def extend_attention_cpu(
    q_extend: torch.Tensor,
    k_extend: torch.Tensor | None,
    v_extend: torch.Tensor | None,
    o_extend: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    k_scale: float,
    v_scale: float,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    max_len_extend: int,
    sm_scale: float,
    logit_cap: float,
    is_cross_attn: bool,
    sliding_window_size: int,
    encoder_lens: torch.Tensor | None,
    sinks: torch.Tensor | None,
    tree_mask: torch.Tensor | None,
    is_causal: bool,
) -> None:
    """Each sequence's new tokens over its prefix and themselves; writes ``o_extend``."""
    _check_plain(k_buffer, is_cross_attn, sliding_window_size, encoder_lens, sinks)
    if k_extend is None or v_extend is None:
        raise _unsupported("KV-shared layers (k_extend=None)")
    num_seqs = seq_lens.shape[0]
    masks = None
    if tree_mask is not None:
        if tree_mask.numel() != num_seqs * max_len_extend * max_len_extend:
            raise ValueError(
                f"tree_mask has {tree_mask.numel()} entries, expected "
                f"num_seqs * max_len_extend^2 = {num_seqs * max_len_extend**2}"
            )
        masks = tree_mask.view(num_seqs, max_len_extend, max_len_extend)
    for b in range(num_seqs):
        n_new = int(extend_seq_lens[b])
        if n_new == 0:
            continue
        start = int(extend_start_loc[b])
        n_prefix = int(seq_lens[b]) - n_new
        rows = req_to_token[int(req_pool_indices[b]), :n_prefix].long()
        k = torch.cat([k_buffer[rows].to(k_extend.dtype), k_extend[start : start + n_new]])
        v = torch.cat([v_buffer[rows].to(v_extend.dtype), v_extend[start : start + n_new]])
        if masks is not None:
            if n_new != max_len_extend:
                raise ValueError("tree_mask needs every sequence to extend by max_len_extend")
            new_part = masks[b].bool()
        elif is_causal:
            new_part = torch.ones(n_new, n_new, dtype=torch.bool).tril()
        else:
            new_part = torch.ones(n_new, n_new, dtype=torch.bool)
        mask = torch.cat([torch.ones(n_new, n_prefix, dtype=torch.bool), new_part], dim=1)
        out = _attend(q_extend[start : start + n_new], k * k_scale, v, sm_scale, logit_cap, mask)
        o_extend[start : start + n_new] = (out * v_scale).to(o_extend.dtype)
