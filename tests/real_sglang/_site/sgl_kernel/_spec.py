"""The index bookkeeping ops of SGLang's CPU speculative decoding, in plain PyTorch.

Each follows ``sgl-kernel/csrc/cpu/spec.cpp`` (and the Triton twins next to the Python callers in
``sglang/kernels/ops/speculative/``): same arguments, same outputs written in place, plain loops
over the (small) batch instead of a parallel-for.
"""

from __future__ import annotations

import torch


def _prefix(lengths: list[int]) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """``req_to_token[rpi[i], start[i]:end[i]] = out_cache_loc[packed segment i]``."""
    starts, ends = start_offset.tolist(), end_offset.tolist()
    offsets = _prefix([e - s for s, e in zip(starts, ends, strict=True)])
    for i, row in enumerate(req_pool_indices.tolist()):
        segment = out_cache_loc[offsets[i] : offsets[i + 1]]
        req_to_token[row, starts[i] : ends[i]] = segment.to(req_to_token.dtype)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """The reverse: pack ``req_to_token[rpi[i], start[i]:end[i]]`` into ``out_cache_loc``."""
    starts, ends = start_offset.tolist(), end_offset.tolist()
    offsets = _prefix([e - s for s, e in zip(starts, ends, strict=True)])
    for i, row in enumerate(req_pool_indices.tolist()):
        segment = req_to_token[row, starts[i] : ends[i]]
        out_cache_loc[offsets[i] : offsets[i + 1]] = segment.to(out_cache_loc.dtype)


def assign_draft_cache_locs_contiguous_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
    topk: int,
    num_steps: int,
) -> None:
    """Each request's ``topk * num_steps`` draft slots, read from ``seq_lens[i]`` on."""
    width = topk * num_steps
    if out_cache_loc.numel() != req_pool_indices.numel() * width:
        raise ValueError("out_cache_loc must hold batch * topk * num_steps slots")
    for i, (row, start) in enumerate(
        zip(req_pool_indices.tolist(), seq_lens.tolist(), strict=True)
    ):
        slots = req_to_token[row, start : start + width]
        out_cache_loc[i * width : (i + 1) * width] = slots.to(out_cache_loc.dtype)


def build_draft_decode_metadata_cpu(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    topk: int,
    num_steps: int,
    pool_len: int,
) -> torch.Tensor:
    """A ``[batch * topk, pool_len]`` table: row ``b * topk + k`` is request b's committed
    prefix followed by candidate k's draft slots (laid out at ``seq_len + k * num_steps``)."""
    rows = req_pool_indices.tolist()
    out = torch.zeros((len(rows) * topk, pool_len), dtype=req_to_token.dtype)
    for b, (row, length) in enumerate(zip(rows, seq_lens.tolist(), strict=True)):
        for k in range(topk):
            flat = b * topk + k
            out[flat, :length] = req_to_token[row, :length]
            start = length + k * num_steps
            out[flat, length : length + num_steps] = req_to_token[row, start : start + num_steps]
    return out


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor,
    accept_lens: torch.Tensor,
    bonus_tokens: torch.Tensor,
    accept_stride: int,
) -> None:
    """``bonus_tokens[i]`` = request i's last accepted token (``accept_lens`` counts it)."""
    flat = accept_tokens.reshape(-1)
    for i, n in enumerate(accept_lens.tolist()):
        bonus_tokens[i] = flat[accept_stride * i + n - 1]


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor,
    out_cache_loc: torch.Tensor,
    accept_out_cache_loc: torch.Tensor,
    size: int | None = None,
) -> None:
    """Pack ``out_cache_loc`` at the accepted indices (``-1`` = rejected), in order."""
    index = accept_index.reshape(-1)
    if size is not None:
        index = index[:size]
    kept = index[index > -1].long()
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept]


def rotate_input_ids_cpu(
    input_ids: torch.Tensor,
    extend_start_loc: torch.Tensor,
    extend_seq_lens: torch.Tensor,
    topk_index: torch.Tensor,
    select_index: torch.Tensor | None = None,
) -> None:
    """Shift each extend segment left by one and put the new draft token last (or at
    ``select_index[i]``)."""
    for i, (start, n) in enumerate(
        zip(extend_start_loc.tolist(), extend_seq_lens.tolist(), strict=True)
    ):
        if n > 1:
            input_ids[start : start + n - 1] = input_ids[start + 1 : start + n].clone()
        if n > 0:
            at = int(select_index[i]) if select_index is not None else start + n - 1
            input_ids[at] = topk_index[i]


def build_tree_kernel_efficient_cpu(
    parent_list: torch.Tensor,
    selected_index: torch.Tensor,
    verified_seq_len: torch.Tensor,
    tree_mask: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    topk: int,
    depth: int,
    draft_token_num: int,
    tree_mask_mode: int,
) -> None:
    """The draft tree EAGLE verifies: its attention mask, each node's position, and the
    first-child / next-sibling links ``verify_tree_greedy_cpu`` walks.

    ``retrive_next_token`` and ``retrive_next_sibling`` come pre-filled with -1. Mask modes:
    0 = FULL_MASK (rows of ``seq_len + draft_token_num``, prefix columns left as given),
    1 = QLEN_ONLY (``draft_token_num`` square per request); 2 (bit-packed) has no CPU producer.
    """
    mode = int(tree_mask_mode)
    if mode not in (0, 1):
        raise ValueError(
            f"tree_mask_mode {mode}: the CPU path has FULL_MASK (0) and QLEN_ONLY (1)"
        )
    n = draft_token_num
    parents = parent_list.reshape(parent_list.shape[0], -1).tolist()
    selected = selected_index.reshape(selected_index.shape[0], -1).tolist()
    seq_lens = verified_seq_len.tolist()
    next_token = retrive_next_token.reshape(len(seq_lens), n).tolist()
    next_sibling = retrive_next_sibling.reshape(len(seq_lens), n).tolist()
    pos_out = positions.reshape(-1)
    index_out = retrive_index.reshape(len(seq_lens), n)
    mask_flat = tree_mask.reshape(-1)
    mask_on: list[int] = []
    mask_off: list[int] = []
    full_offset = 0  # FULL_MASK: rows of earlier requests
    for b, seq_len in enumerate(seq_lens):
        sel, par = selected[b], parents[b]

        def slot_of(token_idx: int, sel: list[int] = sel) -> int | None:
            for p in range(n - 1):
                if sel[p] == token_idx:
                    return p
            return None

        index_out[b] = torch.arange(b * n, (b + 1) * n, dtype=index_out.dtype)
        for i in range(n - 1, 0, -1):
            parent_tb = sel[i - 1] // topk
            if parent_tb == 0:
                parent_pos = 0
            else:
                slot = slot_of(par[parent_tb])
                if slot is None:
                    continue  # no parent among the selected tokens: left unlinked
                parent_pos = slot + 1
            if next_token[b][parent_pos] != -1:
                next_sibling[b][i] = next_token[b][parent_pos]
            next_token[b][parent_pos] = i
        for tid in range(n):
            if mode == 1:
                row_start = (b * n + tid) * n
            else:
                row_start = full_offset + (seq_len + n) * tid + seq_len
            mask_on.append(row_start)
            mask_off.extend(range(row_start + 1, row_start + n))
            position = 0
            if tid > 0:
                cur: int | None = tid - 1
                for _ in range(depth):
                    if cur is None:
                        break
                    position += 1
                    mask_on.append(row_start + cur + 1)
                    parent_tb = sel[cur] // topk
                    cur = None if parent_tb == 0 else slot_of(par[parent_tb])
            pos_out[b * n + tid] = seq_len + position
        full_offset += (seq_len + n) * n
    mask_flat[torch.tensor(mask_off, dtype=torch.long)] = False
    mask_flat[torch.tensor(mask_on, dtype=torch.long)] = True
    retrive_next_token.copy_(torch.tensor(next_token).view_as(retrive_next_token))
    retrive_next_sibling.copy_(torch.tensor(next_sibling).view_as(retrive_next_sibling))


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Walk each request's draft tree from the root and accept the longest path whose draft
    tokens equal the target's greedy token at their parent; the target's token after the last
    accepted node is the bonus. Writes ``predicts`` (by flat draft index), ``accept_index``
    (flat indices, the caller pre-fills -1) and ``accept_token_num`` (drafts accepted, bonus
    excluded)."""
    batch, n = candidates.shape
    steps = accept_index.shape[1]
    cand = candidates.tolist()
    index = retrive_index.tolist()
    first_child = retrive_next_token.tolist()
    sibling = retrive_next_sibling.tolist()
    target = target_predict.reshape(-1).tolist()
    for b in range(batch):
        last = index[b][0]
        accept_index[b, 0] = last
        accepted = 0
        cur = 0
        for _ in range(1, steps):
            cur = first_child[b][cur]
            while cur != -1:
                if cand[b][cur] == target[last]:
                    predicts[last] = target[last]
                    accepted += 1
                    accept_index[b, accepted] = index[b][cur]
                    last = index[b][cur]
                    break
                cur = sibling[b][cur]
            if cur == -1:
                break
        accept_token_num[b] = accepted
        predicts[last] = target[last]
