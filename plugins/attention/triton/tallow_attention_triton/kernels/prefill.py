"""Varlen attention over the paged cache: prefills, chunked prefills, mixed batches.

Grid (query tile, KV head). Sequence ``i`` owns program ids starting at
``query_start_loc[i] // BLOCK_Q + i`` (enough for its ``cdiv(query_len, BLOCK_Q)`` tiles), so
the grid size ``num_tokens // BLOCK_Q + num_seqs`` needs no device-to-host copy and a program
finds its sequence by binary search. A program's ``BLOCK_M`` rows are ``BLOCK_Q`` query tokens
times the ``GROUP`` query heads sharing its KV head (row r = token r // GROUP, head r % GROUP),
so each K/V tile is loaded once for the whole group. Keys come from the paged cache (this
step's K/V are stored before the kernel runs), token by token through the block table.

Query ``j`` of a sequence with ``q_len`` queries and length ``seq_len`` sits at position
``seq_len - q_len + j`` and sees keys ``k <= pos`` (and ``pos - k < window``). Tiles wholly
below the tile's first query position and inside every window are processed without masks.
Without ``CAUSAL`` (encoders: the engine then puts each whole sequence in one step) every
query sees all ``seq_len`` keys, and only the last, partial key tile is masked.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tallow.kernels import allow_next, step_jit, wait_prior

from .common import (
    first_visible_key,
    kv_offsets,
    online_softmax_step,
    online_softmax_step_scaled,
    product_operand,
    scaled_scores,
    scores,
    sink_mass,
    turbo_offsets,
)
from .turbo import code_positions, load_centered


@triton.jit
def _find_sequence(qsl_ptr, num_seqs, pid, BLOCK_Q: tl.constexpr):
    """The last sequence ``i`` whose first program id ``qsl[i] // BLOCK_Q + i`` is <= pid."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        first = tl.load(qsl_ptr + mid) // BLOCK_Q + mid
        if first <= pid:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _masked(
    s,
    n_mask,
    offs_n,
    q_pos,
    window,
    USE_WINDOW: tl.constexpr,
    CHUNKED: tl.constexpr,
    CAUSAL: tl.constexpr,
):
    """Scores ``s`` with -inf where a query may not see a key: past the sequence or below the
    window's start (``n_mask``), after the query (causal), or out of its window (or chunk)."""
    if CAUSAL:
        allowed = n_mask[None, :] & (offs_n[None, :] <= q_pos[:, None])
    else:
        allowed = n_mask[None, :] & (q_pos[:, None] >= 0)
    if USE_WINDOW:
        allowed = allowed & (offs_n[None, :] >= first_visible_key(q_pos, window, CHUNKED)[:, None])
    return tl.where(allowed, s, float("-inf"))


@triton.jit
def _attend_tile(
    acc,
    l_i,
    m_i,
    q,
    q_pos,
    k_cache_ptr,
    v_cache_ptr,
    bt_row,
    start_n,
    kv_lo,
    seq_len,
    qk_scale,
    softcap,
    window,
    kv_head_off,
    stride_cb,
    stride_co,
    offs_d,
    d_mask,
    MASKED: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    CHUNKED: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    CAUSAL: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    offs_n = start_n + tl.arange(0, TILE_N)
    if MASKED:
        n_mask = (offs_n < seq_len) & (offs_n >= kv_lo)
    else:
        n_mask = offs_n < seq_len  # always true here; keeps the loads' mask uniform
    kv_off = kv_offsets(bt_row, offs_n, n_mask, stride_cb, stride_co, kv_head_off, BLOCK_SIZE)
    kv_mask = n_mask[:, None] & d_mask[None, :]
    k = tl.load(k_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    k = k.to(q.dtype)  # a cache in another dtype than the activations
    s = scores(q, k, qk_scale, softcap, USE_SOFTCAP, PRECISION, UPCAST)
    if MASKED:
        s = _masked(s, n_mask, offs_n, q_pos, window, USE_WINDOW, CHUNKED, CAUSAL)
    v = tl.load(v_cache_ptr + kv_off[:, None] + offs_d[None, :], mask=kv_mask, other=0.0)
    v = v.to(q.dtype)
    return online_softmax_step(acc, l_i, m_i, s, v, PRECISION, UPCAST)


@triton.jit
def _attend_turbo_tile(
    acc,
    l_i,
    m_i,
    q,
    q_pos,
    k_codes_ptr,
    v_codes_ptr,
    k_scales_ptr,
    v_scales_ptr,
    bt_row,
    start_n,
    kv_lo,
    seq_len,
    qk_scale,
    softcap,
    window,
    kv_head,
    code_head_off,
    stride_cb,
    stride_co,
    stride_sb,
    stride_so,
    d_mask,
    byte,
    shift,
    high_byte,
    high_shift,
    MASKED: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    CHUNKED: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    CAUSAL: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    KV_BITS: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """:func:`_attend_tile` over a turbo cache (:mod:`.turbo`): ``q`` is rotated, the tiles
    are centered codes, the scales multiply the scores' and the weights' columns."""
    offs_n = start_n + tl.arange(0, TILE_N)
    if MASKED:
        n_mask = (offs_n < seq_len) & (offs_n >= kv_lo)
    else:
        n_mask = offs_n < seq_len
    code_off, scale_off = turbo_offsets(
        bt_row,
        offs_n,
        n_mask,
        stride_cb,
        stride_co,
        code_head_off,
        stride_sb,
        stride_so,
        kv_head,
        BLOCK_SIZE,
    )
    kv_mask = n_mask[:, None] & d_mask[None, :]
    k = load_centered(
        k_codes_ptr, code_off, kv_mask, byte, shift, high_byte, high_shift, KV_BITS, q.dtype
    )
    k_scale = tl.load(k_scales_ptr + scale_off, mask=n_mask, other=0.0).to(tl.float32)
    s = scaled_scores(q, k, k_scale, qk_scale, softcap, USE_SOFTCAP, PRECISION, UPCAST)
    if MASKED:
        s = _masked(s, n_mask, offs_n, q_pos, window, USE_WINDOW, CHUNKED, CAUSAL)
    v = load_centered(
        v_codes_ptr, code_off, kv_mask, byte, shift, high_byte, high_shift, KV_BITS, q.dtype
    )
    v_scale = tl.load(v_scales_ptr + scale_off, mask=n_mask, other=0.0).to(tl.float32)
    return online_softmax_step_scaled(acc, l_i, m_i, s, v, v_scale, PRECISION, UPCAST)


# Step-dependent arguments are not specialized on: see tallow.kernels.jit.
@step_jit(
    values=["window", "num_seqs", "stride_bt"],
    pointers=["block_tables_ptr", "seq_lens_ptr", "qsl_ptr"],
)
def prefill_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    k_scales_ptr,
    v_scales_ptr,
    block_tables_ptr,
    seq_lens_ptr,
    qsl_ptr,
    out_ptr,
    sinks_ptr,
    qk_scale,
    softcap,
    window,
    num_seqs,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_cb,
    stride_co,
    stride_ch,
    stride_bt,
    stride_sb,
    stride_so,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    KV_BITS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    CHUNKED: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    SKIP_SINGLE: tl.constexpr,
    CAUSAL: tl.constexpr,
    F16_PRODUCTS: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    USE_SINKS: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """``SKIP_SINGLE``: leave sequences with exactly one query to the decode kernel.
    ``KV_BITS`` > 0: a turbo cache, as in :func:`.decode.decode_split_kernel`. ``USE_SINKS``:
    ``sinks_ptr`` holds a float32 logit per query head that joins each row's denominator."""
    wait_prior(USE_PDL)  # the program's sequence is found in this step's metadata
    allow_next(USE_PDL)
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)
    seq = _find_sequence(qsl_ptr, num_seqs, pid, BLOCK_Q)
    q_start = tl.load(qsl_ptr + seq)
    q_len = tl.load(qsl_ptr + seq + 1) - q_start
    tile = pid - (q_start // BLOCK_Q + seq)
    if tile * BLOCK_Q >= q_len:
        return
    if SKIP_SINGLE:
        if q_len == 1:
            return
    seq_len = tl.load(seq_lens_ptr + seq)
    ctx = seq_len - q_len  # tokens before this step's first query

    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D_PAD)
    q_idx = tile * BLOCK_Q + offs_m // GROUP
    heads = kv_head * GROUP + offs_m % GROUP
    row_mask = (offs_m < BLOCK_Q * GROUP) & (q_idx < q_len)
    d_mask = offs_d < HEAD_DIM
    rows = (q_start + q_idx).to(tl.int64)
    q = tl.load(
        q_ptr + rows[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
        mask=row_mask[:, None] & d_mask[None, :],
        other=0.0,
    )
    q = product_operand(q, F16_PRODUCTS)
    q_pos = ctx + q_idx

    first_pos = ctx + tile * BLOCK_Q  # the tile's first query position
    last_pos = tl.minimum(first_pos + BLOCK_Q, seq_len) - 1
    if not CAUSAL:
        last_pos = seq_len - 1  # every query sees every key
    kv_lo = 0
    if USE_WINDOW:
        kv_lo = tl.maximum(first_visible_key(first_pos, window, CHUNKED), 0)
    start = (kv_lo // TILE_N) * TILE_N
    # Keys below `full_end` are visible to every query of the tile: no masks needed there.
    full_end = start
    if not USE_WINDOW:
        if CAUSAL:
            full_end = ((first_pos + 1) // TILE_N) * TILE_N
        else:
            full_end = (seq_len // TILE_N) * TILE_N

    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    kv_head_off = kv_head.to(tl.int64) * stride_ch
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    if KV_BITS > 0:
        byte, shift, high_byte, high_shift = code_positions(offs_d, HEAD_DIM, KV_BITS)
        for start_n in range(start, full_end, TILE_N):
            acc, l_i, m_i = _attend_turbo_tile(
                acc,
                l_i,
                m_i,
                q,
                q_pos,
                k_cache_ptr,
                v_cache_ptr,
                k_scales_ptr,
                v_scales_ptr,
                bt_row,
                start_n,
                kv_lo,
                seq_len,
                qk_scale,
                softcap,
                window,
                kv_head,
                kv_head_off,
                stride_cb,
                stride_co,
                stride_sb,
                stride_so,
                d_mask,
                byte,
                shift,
                high_byte,
                high_shift,
                False,
                USE_WINDOW,
                CHUNKED,
                USE_SOFTCAP,
                CAUSAL,
                BLOCK_SIZE,
                TILE_N,
                KV_BITS,
                PRECISION,
                UPCAST,
            )
        for start_n in range(full_end, last_pos + 1, TILE_N):
            acc, l_i, m_i = _attend_turbo_tile(
                acc,
                l_i,
                m_i,
                q,
                q_pos,
                k_cache_ptr,
                v_cache_ptr,
                k_scales_ptr,
                v_scales_ptr,
                bt_row,
                start_n,
                kv_lo,
                seq_len,
                qk_scale,
                softcap,
                window,
                kv_head,
                kv_head_off,
                stride_cb,
                stride_co,
                stride_sb,
                stride_so,
                d_mask,
                byte,
                shift,
                high_byte,
                high_shift,
                True,
                USE_WINDOW,
                CHUNKED,
                USE_SOFTCAP,
                CAUSAL,
                BLOCK_SIZE,
                TILE_N,
                KV_BITS,
                PRECISION,
                UPCAST,
            )
    else:
        for start_n in range(start, full_end, TILE_N):
            acc, l_i, m_i = _attend_tile(
                acc,
                l_i,
                m_i,
                q,
                q_pos,
                k_cache_ptr,
                v_cache_ptr,
                bt_row,
                start_n,
                kv_lo,
                seq_len,
                qk_scale,
                softcap,
                window,
                kv_head_off,
                stride_cb,
                stride_co,
                offs_d,
                d_mask,
                False,
                USE_WINDOW,
                CHUNKED,
                USE_SOFTCAP,
                CAUSAL,
                BLOCK_SIZE,
                TILE_N,
                PRECISION,
                UPCAST,
            )
        for start_n in range(full_end, last_pos + 1, TILE_N):
            acc, l_i, m_i = _attend_tile(
                acc,
                l_i,
                m_i,
                q,
                q_pos,
                k_cache_ptr,
                v_cache_ptr,
                bt_row,
                start_n,
                kv_lo,
                seq_len,
                qk_scale,
                softcap,
                window,
                kv_head_off,
                stride_cb,
                stride_co,
                offs_d,
                d_mask,
                True,
                USE_WINDOW,
                CHUNKED,
                USE_SOFTCAP,
                CAUSAL,
                BLOCK_SIZE,
                TILE_N,
                PRECISION,
                UPCAST,
            )

    l_i += sink_mass(sinks_ptr, heads, m_i, row_mask, USE_SINKS)
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_safe[:, None]
    tl.store(
        out_ptr + rows[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
        o.to(out_ptr.dtype.element_ty),
        mask=row_mask[:, None] & d_mask[None, :],
    )
