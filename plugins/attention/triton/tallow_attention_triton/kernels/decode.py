"""Split-K ("flash-decoding") attention for sequences with one query token, in one launch.

Grid (sequence, KV head, split). A program handles all query heads of one KV group, so each K/V
tile is read from memory once per group, and one contiguous share of the sequence's context:
the context (after the sliding window) is cut into ``TILE_N``-token tiles and the tiles into
``num_splits`` equal runs, computed on the device from the sequence's own length. The launch
grid therefore depends only on host integers fixed per CUDA-graph batch size, and any split
count is correct for any length.

When only one split of a sequence has tiles, that program writes the output directly.
Otherwise each active split writes its partial (unnormalised accumulator, row max, row sum)
and increments a per-(sequence, KV head) arrival counter; the last to arrive merges the
partials, writes the output and resets the counter to zero for the next launch (so the
counters never need clearing, also across CUDA-graph replays).

``FUSED_STORE`` (decode-only steps) folds the KV-cache store of this step's token into the same
launch: split 0 of each (sequence, KV head) writes the new K/V to its slot, and the program whose
tiles hold the new position takes those values from the inputs instead of the cache, rounded to
the cache's dtype exactly as the store rounds them.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .common import kv_offsets, online_softmax_step, scores


@triton.jit
def _tile_range(seq_len, window, USE_WINDOW: tl.constexpr, TILE_N: tl.constexpr):
    """(first token of tile 0, number of tiles) of a one-query sequence's visible context."""
    lo = 0
    if USE_WINDOW:
        lo = tl.maximum(seq_len - window, 0)
    lo = (lo // TILE_N) * TILE_N
    return lo, tl.cdiv(seq_len - lo, TILE_N)


@triton.jit
def _query_row(qsl_ptr, seq, MIXED: tl.constexpr):
    """(row of the sequence's query, whether this kernel serves it). In a mixed batch only
    sequences with exactly one query are served (the prefill kernel takes the others); in a
    decode batch every sequence with a query is (padding sequences may have none)."""
    start = tl.load(qsl_ptr + seq)
    n = tl.load(qsl_ptr + seq + 1) - start
    if MIXED:
        ok = n == 1
    else:
        ok = n > 0
    return start, ok


@triton.jit
def decode_kernel(
    q_ptr, k_ptr, v_ptr, slot_ptr, k_cache_ptr, v_cache_ptr,
    block_tables_ptr, seq_lens_ptr, qsl_ptr,
    out_ptr, part_acc_ptr, part_ml_ptr, counter_ptr,
    qk_scale, softcap, window, num_splits,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
    stride_cb, stride_co, stride_ch, stride_bt,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, G_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr,
    USE_WINDOW: tl.constexpr, USE_SOFTCAP: tl.constexpr,
    MIXED: tl.constexpr, FUSED_STORE: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    row, served = _query_row(qsl_ptr, seq, MIXED)
    if not served:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    row64 = row.to(tl.int64)
    offs_d = tl.arange(0, D_PAD)
    d_mask = offs_d < HEAD_DIM
    kv_head_off = kv_head.to(tl.int64) * stride_ch
    cache_ty = k_cache_ptr.dtype.element_ty

    if FUSED_STORE:
        slot = tl.load(slot_ptr + row64).to(tl.int64)
        has_new = slot >= 0  # slot -1 (padding): nothing stored, the cache is read as it is
        new_pos = tl.where(has_new, seq_len - 1, -1)
        new_mask = d_mask & has_new
        k_new = tl.load(k_ptr + row64 * stride_kt + kv_head * stride_kh + offs_d,
                        mask=new_mask, other=0.0).to(cache_ty)
        v_new = tl.load(v_ptr + row64 * stride_vt + kv_head * stride_vh + offs_d,
                        mask=new_mask, other=0.0).to(cache_ty)
        if split == 0:
            dst = ((slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_co
                   + kv_head_off + offs_d)
            tl.store(k_cache_ptr + dst, k_new, mask=new_mask)
            tl.store(v_cache_ptr + dst, v_new, mask=new_mask)

    lo, n_tiles = _tile_range(seq_len, window, USE_WINDOW, TILE_N)
    per_split = tl.maximum(tl.cdiv(n_tiles, num_splits), 1)
    n_active = tl.cdiv(n_tiles, per_split)
    t_begin = split * per_split
    t_end = tl.minimum(t_begin + per_split, n_tiles)
    if split > 0:
        if t_begin >= t_end:
            return  # an empty split: it neither writes a partial nor arrives

    offs_g = tl.arange(0, G_PAD)
    heads = kv_head * GROUP + offs_g
    g_mask = offs_g < GROUP
    q = tl.load(q_ptr + row64 * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)

    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    window_lo = 0
    if USE_WINDOW:
        window_lo = seq_len - window
    m_i = tl.full([G_PAD], -1.0e30, tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], tl.float32)
    for t in range(t_begin, t_end):
        offs_n = lo + t * TILE_N + tl.arange(0, TILE_N)
        n_mask = offs_n < seq_len
        if USE_WINDOW:
            n_mask = n_mask & (offs_n >= window_lo)
        if FUSED_STORE:
            is_new = offs_n == new_pos
            from_cache = n_mask & (offs_n != new_pos)
        else:
            from_cache = n_mask
        kv_off = kv_offsets(bt_row, offs_n, from_cache, stride_cb, stride_co, kv_head_off,
                            BLOCK_SIZE)
        kv_mask = from_cache[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        if FUSED_STORE:
            k = tl.where(is_new[:, None], k_new[None, :], k)
        k = k.to(q.dtype)  # a cache in another dtype than the activations
        s = scores(q, k, qk_scale, softcap, USE_SOFTCAP, PRECISION, UPCAST)
        s = tl.where(n_mask[None, :], s, float("-inf"))
        v = tl.load(v_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        if FUSED_STORE:
            v = tl.where(is_new[:, None], v_new[None, :], v)
        v = v.to(q.dtype)
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, v, PRECISION, UPCAST)

    out_ptrs = out_ptr + row64 * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
    out_mask = g_mask[:, None] & d_mask[None, :]
    if n_active <= 1:
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)  # an empty context (padding) gives zeros
        tl.store(out_ptrs, (acc / l_safe[:, None]).to(out_ptr.dtype.element_ty), mask=out_mask)
        return

    # partials: acc [B, Hq, S, D_PAD], (max, sum) [B, Hq, S, 2], fp32
    part = (seq.to(tl.int64) * (NUM_KV_HEADS * GROUP) + heads) * num_splits
    tl.store(part_acc_ptr + (part + split)[:, None] * D_PAD + offs_d[None, :], acc,
             mask=g_mask[:, None])
    tl.store(part_ml_ptr + (part + split) * 2, m_i, mask=g_mask)
    tl.store(part_ml_ptr + (part + split) * 2 + 1, l_i, mask=g_mask)
    # Every thread's partial stores precede the arrival (barrier), and the acq_rel atomic makes
    # them visible to the program that arrives last, which reads them past L1 (.cg).
    tl.debug_barrier()
    counter = counter_ptr + seq * NUM_KV_HEADS + kv_head
    arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
    if arrived == n_active - 1:
        tl.atomic_xchg(counter, 0, sem="relaxed", scope="gpu")
        m_all = tl.full([G_PAD], -1.0e30, tl.float32)
        l_all = tl.zeros([G_PAD], tl.float32)
        acc_all = tl.zeros([G_PAD, D_PAD], tl.float32)
        for s_idx in range(0, n_active):
            p = part + s_idx
            m_s = tl.load(part_ml_ptr + p * 2, mask=g_mask, other=-1.0e30, cache_modifier=".cg")
            l_s = tl.load(part_ml_ptr + p * 2 + 1, mask=g_mask, other=0.0, cache_modifier=".cg")
            a_s = tl.load(part_acc_ptr + p[:, None] * D_PAD + offs_d[None, :],
                          mask=g_mask[:, None], other=0.0, cache_modifier=".cg")
            m_new = tl.maximum(m_all, m_s)
            alpha = tl.exp2(m_all - m_new)
            beta = tl.exp2(m_s - m_new)
            acc_all = acc_all * alpha[:, None] + a_s * beta[:, None]
            l_all = l_all * alpha + l_s * beta
            m_all = m_new
        l_all = tl.where(l_all > 0.0, l_all, 1.0)
        tl.store(out_ptrs, (acc_all / l_all[:, None]).to(out_ptr.dtype.element_ty),
                 mask=out_mask)
