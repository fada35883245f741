"""Split-K ("flash-decoding") attention for sequences with one query token.

Grid (sequence, KV head, split). A program handles all query heads of one KV group, so each K/V
tile is read from memory once per group, and one contiguous share of the sequence's context:
the context (after the sliding window) is cut into ``TILE_N``-token tiles and the tiles into
``num_splits`` equal runs, computed on the device from the sequence's own length. The launch
grid therefore depends only on host integers fixed per CUDA-graph batch size, and any split
count is correct for any length. With one split the program writes the output directly;
otherwise it writes its partial (unnormalised accumulator, row max, row sum) and
:func:`decode_reduce_kernel` combines them (many small programs: measured faster than letting
the last-arriving split merge them).

``FUSED_STORE`` (decode-only steps) folds this step's KV-cache store into the split launch:
split 0 of each (sequence, KV head) writes the new K/V to its slot and also folds the new token
into its own partial straight from registers (rounded to the cache dtype as the store rounds
it); every split's cache loop skips that position. Softmax partials merge in any order, so no
program waits for the store, and the tile loads stay untouched (a select on them would stop
Triton from pipelining them into the tensor-core product).

Over an 8-bit float cache (an fp8 KV codec) the kernel reads half the bytes of a 16-bit cache
but reaches a smaller share of the memory bandwidth (docs/benchmarks.md),
with far more instructions per byte: ``F16_PRODUCTS`` runs the tile products in fp16 (one
instruction widens two values); V must be widened before it is staged for the P.V product (the
transposed operand loads have no 8-bit form), which ``WIDEN_V_IN_PTX`` does with one conversion
per pair of values (:func:`common.widen_fp8_in_ptx`) and, where it is off (fp32 activations,
or Triton's interpreter), ``WIDEN_V_IN_REGISTERS`` with a select after the widening;
``LAZY_RESCALE`` rescales the accumulator only when a row's maximum grew by more than 8 (log2
domain);
``SATURATE`` clamps the fused store as :func:`tallow.kernels.kv_cache.to_cache_dtype`
does. The PTX widening and the lazy rescale cut the sm_90 loop of the one-warp program by
about a third of its instructions per 32-key tile (SASS count); the isolated decode of the
throughput probe did not get faster from it, so the loop is not issue-bound.

``KV_BITS`` > 0 reads a turbo cache (:mod:`.turbo`): ``k_cache_ptr``/``v_cache_ptr`` are the
packed codes (strides ``stride_c*`` in bytes), ``k_scales_ptr``/``v_scales_ptr`` a float16 scale
per token and head (strides ``stride_sb``, ``stride_so``, 1), and ``q`` is already rotated. Key
scales multiply the scores' columns and value scales the softmax weights' columns; the store is
never fused there.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tallow.kernels import allow_next, step_jit, wait_prior

from .common import (
    first_visible_key,
    kv_offsets,
    online_softmax_step,
    online_softmax_step_lazy,
    online_softmax_step_scaled,
    product_operand,
    saturate,
    scaled_scores,
    scores,
    sink_mass,
    tanh,
    turbo_offsets,
    widen_fp8_in_ptx,
)
from .turbo import code_positions, load_centered, tile_scales


@triton.jit
def _tile_range(
    seq_len, window, USE_WINDOW: tl.constexpr, CHUNKED: tl.constexpr, TILE_N: tl.constexpr
):
    """(first token of tile 0, number of tiles) of a one-query sequence's visible context."""
    lo = 0
    if USE_WINDOW:
        lo = tl.maximum(first_visible_key(seq_len - 1, window, CHUNKED), 0)
    lo = (lo // TILE_N) * TILE_N
    return lo, tl.cdiv(seq_len - lo, TILE_N)


@triton.jit
def _split_tiles(
    seq_len,
    window,
    num_splits,
    split,
    USE_WINDOW: tl.constexpr,
    CHUNKED: tl.constexpr,
    TILE_N: tl.constexpr,
):
    """(first token of tile 0, first tile, end tile) of split ``split``'s share of a
    one-query sequence's tiles: ``num_splits`` equal runs (the last ones may be empty)."""
    lo, n_tiles = _tile_range(seq_len, window, USE_WINDOW, CHUNKED, TILE_N)
    per_split = tl.maximum(tl.cdiv(n_tiles, num_splits), 1)
    t_begin = split * per_split
    return lo, t_begin, tl.minimum(t_begin + per_split, n_tiles)


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


# Arguments that change from step to step (values, and metadata pointers whose alignment
# depends on the batch) are not specialized on: see tallow.kernels.jit.
@step_jit(
    values=["window", "num_splits", "stride_bt"],
    pointers=["slot_ptr", "block_tables_ptr", "seq_lens_ptr", "qsl_ptr"],
)
def decode_split_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    slot_ptr,
    k_cache_ptr,
    v_cache_ptr,
    k_scales_ptr,
    v_scales_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    qsl_ptr,
    out_ptr,
    part_acc_ptr,
    part_ml_ptr,
    sinks_ptr,
    qk_scale,
    softcap,
    window,
    num_splits,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_ot,
    stride_oh,
    stride_cb,
    stride_co,
    stride_ch,
    stride_bt,
    stride_sb,
    stride_so,
    NUM_Q_HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    G_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    KV_BITS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    CHUNKED: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    MIXED: tl.constexpr,
    SINGLE_SPLIT: tl.constexpr,
    FUSED_STORE: tl.constexpr,
    SATURATE: tl.constexpr,
    F16_PRODUCTS: tl.constexpr,
    WIDEN_V_IN_REGISTERS: tl.constexpr,
    WIDEN_V_IN_PTX: tl.constexpr,
    LAZY_RESCALE: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    USE_SINKS: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    tl.static_assert(
        KV_BITS == 0 or not FUSED_STORE, "the store is fused only for caches that cast (KV_BITS 0)"
    )
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    # Even whether this program has work depends on this step's metadata: wait first.
    wait_prior(USE_PDL)
    allow_next(USE_PDL)
    row, served = _query_row(qsl_ptr, seq, MIXED)
    if not served:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    row64 = row.to(tl.int64)
    offs_d = tl.arange(0, D_PAD)
    d_mask = offs_d < HEAD_DIM
    kv_head_off = kv_head.to(tl.int64) * stride_ch

    if FUSED_STORE:
        slot = tl.load(slot_ptr + row64).to(tl.int64)
        # slot -1 (padding): nothing is stored and the cache is read as it is
        has_new = (slot >= 0) & (seq_len > 0)
        new_pos = tl.where(has_new, seq_len - 1, -1)
        new_mask = d_mask & has_new
        cache_ty = k_cache_ptr.dtype.element_ty
        k_new = saturate(
            tl.load(
                k_ptr + row64 * stride_kt + kv_head * stride_kh + offs_d, mask=new_mask, other=0.0
            ),
            SATURATE,
        ).to(cache_ty)
        v_new = saturate(
            tl.load(
                v_ptr + row64 * stride_vt + kv_head * stride_vh + offs_d, mask=new_mask, other=0.0
            ),
            SATURATE,
        ).to(cache_ty)
        dst = (
            (slot // BLOCK_SIZE) * stride_cb
            + (slot % BLOCK_SIZE) * stride_co
            + kv_head_off
            + offs_d
        )
        tl.store(k_cache_ptr + dst, k_new, mask=new_mask & (split == 0))
        tl.store(v_cache_ptr + dst, v_new, mask=new_mask & (split == 0))

    lo, t_begin, t_end = _split_tiles(
        seq_len, window, num_splits, split, USE_WINDOW, CHUNKED, TILE_N
    )
    if not SINGLE_SPLIT:
        # An empty split writes nothing: the reduce derives the same count of active splits.
        if t_begin >= t_end:
            return

    offs_g = tl.arange(0, G_PAD)
    heads = kv_head * GROUP + offs_g
    g_mask = offs_g < GROUP
    q = tl.load(
        q_ptr + row64 * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=g_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    q = product_operand(q, F16_PRODUCTS)

    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    if KV_BITS > 0:
        byte, shift, high_byte, high_shift = code_positions(offs_d, HEAD_DIM, KV_BITS)
    window_lo = 0
    if USE_WINDOW:
        window_lo = first_visible_key(seq_len - 1, window, CHUNKED)
    m_i = tl.full([G_PAD], -1.0e30, tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], tl.float32)
    if FUSED_STORE:
        # The new token (split 0 only) is the online softmax's first key, taken from
        # registers: folded in before the loop, its K/V need no registers through it.
        qf = q.to(tl.float32)
        s_new = tl.sum(qf * k_new.to(q.dtype).to(tl.float32)[None, :], 1)
        if USE_SOFTCAP:
            s_new = softcap * tanh(s_new * qk_scale)
        else:
            s_new = s_new * qk_scale
        s_new = tl.where(has_new & (split == 0), s_new, float("-inf"))
        m_i = tl.maximum(m_i, s_new)
        l_i = tl.exp2(s_new - m_i)  # 1 for the new token, 0 elsewhere
        acc = l_i[:, None] * v_new.to(q.dtype).to(tl.float32)[None, :]
    if KV_BITS > 0:
        # scales read one tile ahead (see kernels/turbo_decode.py)
        k_scale, v_scale = tile_scales(
            k_scales_ptr,
            v_scales_ptr,
            bt_row,
            lo + t_begin * TILE_N,
            seq_len,
            window_lo,
            t_begin < t_end,
            kv_head,
            stride_sb,
            stride_so,
            USE_WINDOW,
            BLOCK_SIZE,
            TILE_N,
        )
    for t in range(t_begin, t_end):
        offs_n = lo + t * TILE_N + tl.arange(0, TILE_N)
        n_mask = offs_n < seq_len
        if USE_WINDOW:
            n_mask = n_mask & (offs_n >= window_lo)
        if FUSED_STORE:
            n_mask = n_mask & (offs_n != new_pos)  # folded in below, from registers
        if KV_BITS > 0:
            # codes of the rotated keys and values, their scales per token
            kv_mask = n_mask[:, None] & d_mask[None, :]
            code_off, _ = turbo_offsets(
                bt_row,
                offs_n,
                n_mask,
                stride_cb,
                stride_co,
                kv_head_off,
                stride_sb,
                stride_so,
                kv_head,
                BLOCK_SIZE,
            )
            k = load_centered(
                k_cache_ptr, code_off, kv_mask, byte, shift, high_byte, high_shift, KV_BITS, q.dtype
            )
            next_k_scale, next_v_scale = tile_scales(
                k_scales_ptr,
                v_scales_ptr,
                bt_row,
                lo + (t + 1) * TILE_N,
                seq_len,
                window_lo,
                t + 1 < t_end,
                kv_head,
                stride_sb,
                stride_so,
                USE_WINDOW,
                BLOCK_SIZE,
                TILE_N,
            )
            s = scaled_scores(q, k, k_scale, qk_scale, softcap, USE_SOFTCAP, PRECISION, UPCAST)
            s = tl.where(n_mask[None, :], s, float("-inf"))
            v = load_centered(
                v_cache_ptr, code_off, kv_mask, byte, shift, high_byte, high_shift, KV_BITS, q.dtype
            )
            acc, l_i, m_i = online_softmax_step_scaled(
                acc, l_i, m_i, s, v, v_scale, PRECISION, UPCAST
            )
            k_scale = next_k_scale
            v_scale = next_v_scale
        else:
            kv_off = kv_offsets(
                bt_row, offs_n, n_mask, stride_cb, stride_co, kv_head_off, BLOCK_SIZE
            )
            kv_mask = n_mask[:, None] & d_mask[None, :]
            k = tl.load(k_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
            k = k.to(q.dtype)  # a cache in another dtype than the activations
            s = scores(q, k, qk_scale, softcap, USE_SOFTCAP, PRECISION, UPCAST)
            s = tl.where(n_mask[None, :], s, float("-inf"))
            v = tl.load(v_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
            if WIDEN_V_IN_PTX:
                # masked keys already loaded as 0; the row indices only anchor Triton's layout
                anchor = offs_n[:, None] + tl.zeros([TILE_N, D_PAD], tl.int32)
                v = widen_fp8_in_ptx(v, anchor)  # fp16, as q is (F16_PRODUCTS)
            else:
                v = v.to(q.dtype)
                if WIDEN_V_IN_REGISTERS:
                    # An 8-bit V staged for the P.V product is read back transposed one byte
                    # at a time; with a select after the widening, Triton widens V in
                    # registers first and stages it 16-bit (read back with transposed loads
                    # of 16-bit pairs). The 8-bit tile itself still arrives through the
                    # asynchronous copy pipeline.
                    v = tl.where(kv_mask, v, 0.0)
            if LAZY_RESCALE:
                acc, l_i, m_i = online_softmax_step_lazy(acc, l_i, m_i, s, v, PRECISION, UPCAST)
            else:
                acc, l_i, m_i = online_softmax_step(acc, l_i, m_i, s, v, PRECISION, UPCAST)

    if SINGLE_SPLIT:
        # the sinks join the denominator once, here or in the reduce kernel
        l_i += sink_mass(sinks_ptr, heads, m_i, g_mask, USE_SINKS)
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)  # an empty context (padding) gives zeros
        o = acc / l_safe[:, None]
        tl.store(
            out_ptr + row64 * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
            o.to(out_ptr.dtype.element_ty),
            mask=g_mask[:, None] & d_mask[None, :],
        )
    else:
        # partials: acc [B, Hq, S, D_PAD], (max, sum) [B, Hq, S, 2], all fp32
        part = (seq.to(tl.int64) * NUM_Q_HEADS + heads) * num_splits + split
        tl.store(part_acc_ptr + part[:, None] * D_PAD + offs_d[None, :], acc, mask=g_mask[:, None])
        tl.store(part_ml_ptr + part * 2, m_i, mask=g_mask)
        tl.store(part_ml_ptr + part * 2 + 1, l_i, mask=g_mask)


@step_jit(values=["window", "num_splits"], pointers=["seq_lens_ptr", "qsl_ptr"])
def decode_reduce_kernel(
    part_acc_ptr,
    part_ml_ptr,
    seq_lens_ptr,
    qsl_ptr,
    out_ptr,
    sinks_ptr,
    window,
    num_splits,
    stride_ot,
    stride_oh,
    NUM_Q_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    S_PAD: tl.constexpr,
    TILE_N: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    CHUNKED: tl.constexpr,
    MIXED: tl.constexpr,
    USE_SINKS: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Grid (sequence, query head): out = sum_s 2^(m_s - M) acc_s / (sum_s 2^(m_s - M) l_s
    + the head's sink mass at M, with ``USE_SINKS``)."""
    seq = tl.program_id(0)
    head = tl.program_id(1)
    wait_prior(USE_PDL)  # the partials are the split kernel's output
    allow_next(USE_PDL)
    row, served = _query_row(qsl_ptr, seq, MIXED)
    if not served:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    lo, n_tiles = _tile_range(seq_len, window, USE_WINDOW, CHUNKED, TILE_N)
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
    total += tl.sum(
        sink_mass(
            sinks_ptr,
            head + tl.zeros([1], tl.int32),
            m_all + tl.zeros([1], tl.float32),
            head + tl.zeros([1], tl.int32) >= 0,
            USE_SINKS,
        ),
        0,
    )
    total = tl.where(total > 0.0, total, 1.0)
    acc = tl.load(
        part_acc_ptr + part[:, None] * D_PAD + offs_d[None, :], mask=s_mask[:, None], other=0.0
    )
    o = tl.sum(acc * w[:, None], 0) / total
    tl.store(
        out_ptr + row.to(tl.int64) * stride_ot + head * stride_oh + offs_d,
        o.to(out_ptr.dtype.element_ty),
        mask=offs_d < HEAD_DIM,
    )
