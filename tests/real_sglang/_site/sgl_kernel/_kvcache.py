"""KV-pool row copies across every layer, in plain PyTorch (after ``csrc/cpu/kvcache.cpp``)."""

from __future__ import annotations

import ctypes

import torch


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """For every K/V buffer b: ``buf_b[tgt_loc[i]] = buf_b[src_loc[i]]`` (all rows read first).

    SGLang hands over raw base addresses (``data_ptrs``, uint64) and row sizes in bytes
    (``strides``), as its Triton kernel takes them: each buffer is viewed as bytes, up to the
    highest row touched, in this process's own memory.
    """
    if tgt_loc.numel() == 0:
        return
    tgt, src = tgt_loc.long(), src_loc.long()
    rows = int(torch.maximum(tgt.max(), src.max())) + 1
    for base, stride in zip(data_ptrs.tolist(), strides.tolist(), strict=True):
        raw = (ctypes.c_uint8 * (rows * stride)).from_address(base)
        buf = torch.frombuffer(raw, dtype=torch.uint8).view(rows, stride)
        buf[tgt] = buf[src].clone()
