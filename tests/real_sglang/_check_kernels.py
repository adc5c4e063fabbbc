"""Checks of the ``sgl_kernel`` stand-in; run by the SGLang env's Python with ``_site`` on the
path (it has torch). Prints one JSON object of results; ``test_kernels.py`` asserts on them.

Attention is compared with ``torch.nn.functional.scaled_dot_product_attention`` in float32 on
the same bfloat16 inputs, laid out in a paged KV pool with shuffled slots the way SGLang's
allocator hands them out; the index ops with hand-worked cases from the kernel semantics.
"""

from __future__ import annotations

import json
import sys

import sgl_kernel
import torch
import torch.nn.functional as F

H, HKV, D = 4, 2, 32
POOL = 256
SCALE = D**-0.5


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``q`` [M, H, D], ``k``/``v`` [N, HKV, D], ``mask`` [M, N] bool -> [M, H, D] float32."""
    out = F.scaled_dot_product_attention(
        q.float().transpose(0, 1),
        k.float().repeat_interleave(H // HKV, dim=1).transpose(0, 1),
        v.float().repeat_interleave(H // HKV, dim=1).transpose(0, 1),
        attn_mask=mask,
        scale=SCALE,
    )
    return out.transpose(0, 1)


def paged(lengths: list[int], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """A pool with random K/V and a req_to_token table naming shuffled slots per request."""
    k_buf = torch.randn(POOL, HKV, D, generator=gen).to(torch.bfloat16)
    v_buf = torch.randn(POOL, HKV, D, generator=gen).to(torch.bfloat16)
    slots = torch.randperm(POOL - 1, generator=gen)[: sum(lengths)] + 1  # slot 0: padding
    req_to_token = torch.zeros(8, 128, dtype=torch.int32)
    rows = torch.tensor([5, 2, 7][: len(lengths)], dtype=torch.int64)
    at = 0
    for row, n in zip(rows.tolist(), lengths, strict=True):
        req_to_token[row, :n] = slots[at : at + n].int()
        at += n
    return {"k": k_buf, "v": v_buf, "r2t": req_to_token, "rows": rows}


def check_decode(gen: torch.Generator, via_ops: bool) -> float:
    lengths = [17, 5, 40]
    p = paged(lengths, gen)
    q = torch.randn(3, H, D, generator=gen).to(torch.bfloat16)
    new_k = torch.randn(3, HKV, D, generator=gen).to(torch.bfloat16)
    new_v = torch.randn(3, HKV, D, generator=gen).to(torch.bfloat16)
    seq_lens = torch.tensor(lengths, dtype=torch.int64)
    last = zip(p["rows"].tolist(), lengths, strict=True)
    loc = torch.stack([p["r2t"][r, n - 1].long() for r, n in last])
    out = torch.empty(3, H, D, dtype=torch.bfloat16)
    logits = torch.zeros(3, H, 8, D + 1)
    fn = torch.ops.sgl_kernel.decode_attention_cpu if via_ops else sgl_kernel.decode_attention_cpu
    fn(q, p["k"], p["v"], 1.0, 1.0, out, new_k, new_v, loc, logits, p["r2t"], p["rows"],
       seq_lens, SCALE, 0.0, False, 0, None, None)  # fmt: skip
    err = 0.0
    for b, (row, n) in enumerate(zip(p["rows"].tolist(), lengths, strict=True)):
        idx = p["r2t"][row, :n].long()
        k, v = p["k"][idx].clone(), p["v"][idx].clone()
        if not (torch.equal(k[-1], new_k[b]) and torch.equal(v[-1], new_v[b])):
            return float("inf")  # the new token's K/V must be in the pool
        ref = sdpa(q[b : b + 1], k, v, torch.ones(1, n, dtype=torch.bool))
        err = max(err, (out[b].float() - ref[0]).abs().max().item())
    return err


def extend_case(gen: torch.Generator, n_new: int, tree: torch.Tensor | None, via_ops: bool,
                causal: bool = True) -> tuple[float, float]:  # fmt: skip
    """Max error against SDPA with the right mask, and against SDPA with no mask on the new
    tokens (to show the check tells the masks apart)."""
    prefixes = [9, 0, 23]
    p = paged([n + n_new for n in prefixes], gen)
    total = n_new * len(prefixes)
    q = torch.randn(total, H, D, generator=gen).to(torch.bfloat16)
    k_ext = torch.empty(total, HKV, D, dtype=torch.bfloat16)
    v_ext = torch.empty(total, HKV, D, dtype=torch.bfloat16)
    for b, (row, n) in enumerate(zip(p["rows"].tolist(), prefixes, strict=True)):
        idx = p["r2t"][row, n : n + n_new].long()  # SGLang stores the new K/V first
        k_ext[b * n_new : (b + 1) * n_new] = p["k"][idx]
        v_ext[b * n_new : (b + 1) * n_new] = p["v"][idx]
    seq_lens = torch.tensor([n + n_new for n in prefixes], dtype=torch.int64)
    ext_lens = torch.full((3,), n_new, dtype=torch.int32)
    starts = torch.arange(0, total, n_new, dtype=torch.int32)
    out = torch.empty(total, H, D, dtype=torch.bfloat16)
    masks = None if tree is None else tree.repeat(3, 1, 1).reshape(-1).contiguous()
    fn = torch.ops.sgl_kernel.extend_attention_cpu if via_ops else sgl_kernel.extend_attention_cpu
    fn(q, k_ext, v_ext, out, p["k"], p["v"], 1.0, 1.0, p["r2t"], p["rows"], seq_lens, ext_lens,
       starts, n_new, SCALE, 0.0, False, 0, None, None, masks, causal)  # fmt: skip
    err, err_unmasked = 0.0, 0.0
    for b, (row, n) in enumerate(zip(p["rows"].tolist(), prefixes, strict=True)):
        idx = p["r2t"][row, : n + n_new].long()
        if tree is not None:
            new_part = tree
        elif causal:
            new_part = torch.ones(n_new, n_new, dtype=torch.bool).tril()
        else:
            new_part = torch.ones(n_new, n_new, dtype=torch.bool)
        mask = torch.cat([torch.ones(n_new, n, dtype=torch.bool), new_part], dim=1)
        rows = slice(b * n_new, (b + 1) * n_new)
        ref = sdpa(q[rows], p["k"][idx], p["v"][idx], mask)
        loose = sdpa(q[rows], p["k"][idx], p["v"][idx], torch.ones_like(mask))
        err = max(err, (out[rows].float() - ref).abs().max().item())
        err_unmasked = max(err_unmasked, (out[rows].float() - loose).abs().max().item())
    return err, err_unmasked


# The tree of the hand-worked cases (topk 2, 2 steps, 4 draft tokens): candidates 0 and 1 are
# the root's children, candidate 2 is candidate 0's child; nodes 1, 2, 3 = candidates 0, 1, 2.
TREE_MASK = torch.tensor(
    [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool
)


def check_build_tree(topk: int, depth: int, parents: list[int], selected: list[int], mode: int,
                     seq_len: int) -> dict[str, object]:  # fmt: skip
    n = len(selected) + 1
    mask_len = n * n if mode == 1 else (seq_len + n) * n
    tree_mask = torch.full((mask_len,), True)
    positions = torch.empty(n, dtype=torch.int64)
    index = torch.empty(1, n, dtype=torch.int64)
    next_token = torch.full((1, n), -1, dtype=torch.int64)
    sibling = torch.full((1, n), -1, dtype=torch.int64)
    sgl_kernel.build_tree_kernel_efficient_cpu(
        torch.tensor([parents]), torch.tensor([selected]), torch.tensor([seq_len]), tree_mask,
        positions, index, next_token, sibling, topk, depth, n, mode)  # fmt: skip
    if mode == 0:  # the new-token block of each row, after the seq_len prefix columns
        rows = tree_mask.view(n, seq_len + n)
        prefix_kept = bool(rows[:, :seq_len].all())
        block = rows[:, seq_len:]
    else:
        prefix_kept, block = True, tree_mask.view(n, n)
    return {
        "positions": positions.tolist(),
        "index": index[0].tolist(),
        "next_token": next_token[0].tolist(),
        "sibling": sibling[0].tolist(),
        "mask": block.int().tolist(),
        "prefix_kept": prefix_kept,
    }


def check_verify(target: list[int]) -> dict[str, object]:
    candidates = torch.tensor([[100, 11, 12, 13]])
    index = torch.tensor([[0, 1, 2, 3]])
    next_token = torch.tensor([[1, 3, -1, -1]])
    sibling = torch.tensor([[-1, 2, -1, -1]])
    predicts = torch.full((4,), -7, dtype=torch.int32)
    accept_index = torch.full((1, 3), -1, dtype=torch.int32)
    accept_num = torch.zeros(1, dtype=torch.int32)
    sgl_kernel.verify_tree_greedy_cpu(
        predicts=predicts, accept_index=accept_index, accept_token_num=accept_num,
        candidates=candidates, retrive_index=index, retrive_next_token=next_token,
        retrive_next_sibling=sibling, target_predict=torch.tensor([target]))  # fmt: skip
    return {
        "predicts": predicts.tolist(),
        "accept_index": accept_index[0].tolist(),
        "accepted": int(accept_num[0]),
    }


def check_pool_ops() -> dict[str, object]:
    r2t = torch.zeros(4, 16, dtype=torch.int32)
    rows = torch.tensor([2, 0])
    start, end = torch.tensor([3, 0], dtype=torch.int32), torch.tensor([5, 3], dtype=torch.int32)
    locs = torch.tensor([40, 41, 50, 51, 52])
    sgl_kernel.assign_req_to_token_pool_cpu(rows, r2t, start, end, locs, 16)
    back = torch.empty(5, dtype=torch.int64)
    sgl_kernel.assign_extend_cache_locs_cpu(rows, r2t, start, end, back, 16)
    draft = torch.empty(4, dtype=torch.int64)
    sgl_kernel.assign_draft_cache_locs_contiguous_cpu(
        torch.tensor([2, 0]), r2t, torch.tensor([3, 1]), draft, 16, 1, 2
    )
    table = sgl_kernel.build_draft_decode_metadata_cpu(
        r2t, torch.tensor([0]), torch.tensor([1]), 2, 1, 16
    )
    bonus = torch.empty(2, dtype=torch.int32)
    sgl_kernel.fill_bonus_tokens_cpu(
        torch.tensor([[5, 6, 7], [8, 9, 10]], dtype=torch.int32),
        torch.tensor([2, 3], dtype=torch.int32), bonus, 3)  # fmt: skip
    kept = torch.zeros(3, dtype=torch.int64)
    sgl_kernel.fill_accept_out_cache_loc_cpu(
        torch.tensor([0, -1, 3, 2], dtype=torch.int32), torch.tensor([70, 71, 72, 73]), kept
    )
    layers = [torch.arange(20, dtype=torch.bfloat16).view(10, 2) + 100 * i for i in range(2)]
    before = [t.clone() for t in layers]
    sgl_kernel.copy_all_layer_kv_cache_cpu(
        torch.tensor([t.data_ptr() for t in layers], dtype=torch.uint64),
        torch.tensor([t.stride(0) * t.element_size() for t in layers]),
        torch.tensor([7, 8]), torch.tensor([1, 7]))  # fmt: skip
    copied = all(
        torch.equal(t[7], b[1]) and torch.equal(t[8], b[7]) and torch.equal(t[0], b[0])
        for t, b in zip(layers, before, strict=True)
    )
    return {
        "req_to_token_rows": [r2t[2, :6].tolist(), r2t[0, :4].tolist()],
        "extend_locs": back.tolist(),
        "draft_locs": draft.tolist(),
        "draft_table": table[:, :2].tolist(),
        "bonus": bonus.tolist(),
        "accepted_locs": kept.tolist(),
        "kv_rows_copied": copied,
    }


def main() -> None:
    gen = torch.Generator().manual_seed(7)
    tree_err, tree_unmasked = extend_case(gen, 4, TREE_MASK, via_ops=True)
    causal_err, causal_unmasked = extend_case(gen, 6, None, via_ops=False)
    ops_causal_err, _ = extend_case(gen, 5, None, via_ops=True)
    full_err, _ = extend_case(gen, 5, None, via_ops=True, causal=False)
    results = {
        "decode_error": check_decode(gen, via_ops=False),
        "decode_error_via_ops": check_decode(gen, via_ops=True),
        "extend_error": causal_err,
        "extend_error_if_unmasked": causal_unmasked,
        "extend_error_via_ops": ops_causal_err,
        "extend_error_not_causal": full_err,
        "tree_error": tree_err,
        "tree_error_if_unmasked": tree_unmasked,
        "chain": check_build_tree(1, 3, [-1, 0, 1], [0, 1, 2], 1, 10),
        "tree": check_build_tree(2, 2, [-1, 0, 1], [0, 1, 2], 1, 10),
        "tree_full_mask": check_build_tree(2, 2, [-1, 0, 1], [0, 1, 2], 0, 3),
        "verify_sibling": check_verify([12, 0, 55, 0]),
        "verify_path": check_verify([11, 13, 0, 66]),
        "verify_none": check_verify([99, 0, 0, 0]),
        "pool": check_pool_ops(),
    }
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
