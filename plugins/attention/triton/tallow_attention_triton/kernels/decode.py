"""Split-K ("flash-decoding") attention for sequences with one query token.

Grid (sequence, KV head, split). A program handles all query heads of one KV group, so each K/V
tile is read from memory once per group, and one contiguous share of the sequence's context:
the context (after the sliding window) is cut into ``TILE_N``-token tiles and the tiles into
``num_splits`` equal runs, computed on the device from the sequence's own length. The launch
grid therefore depends only on host integers fixed per CUDA-graph batch size, and any split
count is correct for any length. With one split the program writes the output directly;
otherwise it writes its partial (unnormalised accumulator, row max, row sum) and
:func:`decode_reduce_kernel` combines them.
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
def decode_split_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr, qsl_ptr,
    out_ptr, part_acc_ptr, part_ml_ptr,
    qk_scale, softcap, window, num_splits,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_co, stride_ch, stride_bt,
    NUM_Q_HEADS: tl.constexpr, GROUP: tl.constexpr, G_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr,
    USE_WINDOW: tl.constexpr, USE_SOFTCAP: tl.constexpr,
    MIXED: tl.constexpr, SINGLE_SPLIT: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    row, served = _query_row(qsl_ptr, seq, MIXED)
    if not served:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    lo, n_tiles = _tile_range(seq_len, window, USE_WINDOW, TILE_N)
    per_split = tl.maximum(tl.cdiv(n_tiles, num_splits), 1)
    t_begin = split * per_split
    t_end = tl.minimum(t_begin + per_split, n_tiles)
    if not SINGLE_SPLIT:
        # An empty split writes nothing: the reduce derives the same count of active splits.
        if t_begin >= t_end:
            return

    offs_g = tl.arange(0, G_PAD)
    offs_d = tl.arange(0, D_PAD)
    heads = kv_head * GROUP + offs_g
    g_mask = offs_g < GROUP
    d_mask = offs_d < HEAD_DIM
    row64 = row.to(tl.int64)
    q = tl.load(q_ptr + row64 * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_mask[:, None] & d_mask[None, :], other=0.0)

    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    kv_head_off = kv_head.to(tl.int64) * stride_ch
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
        kv_off = kv_offsets(bt_row, offs_n, n_mask, stride_cb, stride_co, kv_head_off,
                            BLOCK_SIZE)
        kv_mask = n_mask[:, None] & d_mask[None, :]
        k = tl.load(k_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        k = k.to(q.dtype)  # a cache in another dtype than the activations
        s = scores(q, k, qk_scale, softcap, USE_SOFTCAP, PRECISION, UPCAST)
        s = tl.where(n_mask[None, :], s, float("-inf"))
        v = tl.load(v_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
        v = v.to(q.dtype)
        acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, v, PRECISION, UPCAST)

    if SINGLE_SPLIT:
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)  # an empty context (padding) gives zeros
        o = acc / l_safe[:, None]
        tl.store(out_ptr + row64 * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=g_mask[:, None] & d_mask[None, :])
    else:
        # partials: acc [B, Hq, S, D_PAD], (max, sum) [B, Hq, S, 2], all fp32
        part = (seq.to(tl.int64) * NUM_Q_HEADS + heads) * num_splits + split
        tl.store(part_acc_ptr + part[:, None] * D_PAD + offs_d[None, :], acc,
                 mask=g_mask[:, None])
        tl.store(part_ml_ptr + part * 2, m_i, mask=g_mask)
        tl.store(part_ml_ptr + part * 2 + 1, l_i, mask=g_mask)


@triton.jit
def decode_reduce_kernel(
    part_acc_ptr, part_ml_ptr, seq_lens_ptr, qsl_ptr, out_ptr,
    window, num_splits, stride_ot, stride_oh,
    NUM_Q_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    S_PAD: tl.constexpr, TILE_N: tl.constexpr,
    USE_WINDOW: tl.constexpr, MIXED: tl.constexpr,
):
    """Grid (sequence, query head): out = sum_s 2^(m_s - M) acc_s / sum_s 2^(m_s - M) l_s."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    row, served = _query_row(qsl_ptr, seq, MIXED)
    if not served:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    lo, n_tiles = _tile_range(seq_len, window, USE_WINDOW, TILE_N)
    per_split = tl.maximum(tl.cdiv(n_tiles, num_splits), 1)
    n_active = tl.cdiv(n_tiles, per_split)

    offs_s = tl.arange(0, S_PAD)
    offs_d = tl.arange(0, D_PAD)
    s_mask = offs_s < n_active
    part = (seq.to(tl.int64) * NUM_Q_HEADS + head) * num_splits + offs_s
    m = tl.load(part_ml_ptr + part * 2, mask=s_mask, other=float("-inf"))
    row_sum = tl.load(part_ml_ptr + part * 2 + 1, mask=s_mask, other=0.0)
    m_all = tl.max(m, 0)
    m_all = tl.where(n_active > 0, m_all, 0.0)  # no context at all (padding): zeros, not NaN
    w = tl.where(s_mask, tl.exp2(m - m_all), 0.0)
    total = tl.sum(w * row_sum, 0)
    total = tl.where(total > 0.0, total, 1.0)
    acc = tl.load(part_acc_ptr + part[:, None] * D_PAD + offs_d[None, :],
                  mask=s_mask[:, None], other=0.0)
    o = tl.sum(acc * w[:, None], 0) / total
    tl.store(out_ptr + row.to(tl.int64) * stride_ot + head * stride_oh + offs_d,
             o.to(out_ptr.dtype.element_ty), mask=offs_d < HEAD_DIM)
