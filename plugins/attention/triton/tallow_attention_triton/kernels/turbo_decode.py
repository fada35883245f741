"""Split-K decode over a 4-bit turbo cache (``turbo4``), reading each code byte once.

The 4-bit packing (:mod:`.turbo`) puts coordinate ``d < D/2`` in the low nibble of byte ``d``
and coordinate ``d + D/2`` in its high nibble. A product over coordinates may take them in
any order, so this kernel never interleaves the two: a key or value tile is two tiles of
``D/2`` coordinates, the low nibbles and the high nibbles of one contiguous run of bytes per
token, and the query and the output are cut in the same two halves. Per byte that is one
16-byte-load share, one unpacking into two fp16 values (:func:`.turbo.unpack_nibbles`, 1.5
instructions per value in PTX) and the tensor-core products; per token the key's scale
multiplies its column of scores and the value's scale its column of softmax weights, so no
tile element is ever scaled. With 16-bit activations the products run in fp16: the codes
(``code - 7.5``) are exact in it, and a bf16 query widens to fp16 exactly (clamped to fp16's
range, :func:`.common.product_operand`).

Grid, splits and partials are those of :func:`.decode.decode_split_kernel` (whose reduce
kernel combines them): program (sequence, KV head, split) takes all query heads of its KV
group over one contiguous run of ``TILE_N``-token tiles of the sequence's context.
"""

from __future__ import annotations

import triton.language as tl

from tallow.kernels import allow_next, step_jit, wait_prior

from .common import (
    dot,
    first_visible_key,
    product_operand,
    scaled_weights,
    sink_mass,
    tanh,
    turbo_offsets,
)
from .decode import _query_row, _split_tiles
from .turbo import load_nibble_halves, tile_scales


# Step-dependent arguments are not specialized on: see tallow.kernels.jit.
@step_jit(
    values=["window", "num_splits", "stride_bt"],
    pointers=["block_tables_ptr", "seq_lens_ptr", "qsl_ptr"],
)
def decode_nibbles_kernel(
    q_ptr,
    k_codes_ptr,
    v_codes_ptr,
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
    HALF: tl.constexpr,
    H_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
    USE_WINDOW: tl.constexpr,
    CHUNKED: tl.constexpr,
    USE_SOFTCAP: tl.constexpr,
    MIXED: tl.constexpr,
    SINGLE_SPLIT: tl.constexpr,
    F16_PRODUCTS: tl.constexpr,
    UNPACK_IN_PTX: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    USE_SINKS: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Codes ``[blocks, bs, Hkv, D/2]`` (strides ``stride_c*``, bytes), scales float16
    ``[blocks, bs, Hkv]`` (strides ``stride_sb``, ``stride_so``, 1); ``q`` rotated as
    :func:`tallow_attention_triton.turbo_ops.rotate_queries` makes it; the output (or the
    partials) in the rotated coordinates, as :func:`.decode.decode_split_kernel` writes them.
    ``HALF`` is ``HEAD_DIM // 2``, ``H_PAD`` ``D_PAD // 2``."""
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    wait_prior(USE_PDL)  # even whether this program has work depends on this step's metadata
    allow_next(USE_PDL)
    row, served = _query_row(qsl_ptr, seq, MIXED)
    if not served:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    lo, t_begin, t_end = _split_tiles(
        seq_len, window, num_splits, split, USE_WINDOW, CHUNKED, TILE_N
    )
    if not SINGLE_SPLIT:
        # An empty split writes nothing: the reduce derives the same count of active splits.
        if t_begin >= t_end:
            return

    row64 = row.to(tl.int64)
    offs_g = tl.arange(0, G_PAD)
    heads = kv_head * GROUP + offs_g
    g_mask = offs_g < GROUP
    offs_h = tl.arange(0, H_PAD)
    gh_mask = g_mask[:, None] & (offs_h < HALF)[None, :]
    q_row = q_ptr + row64 * stride_qt + heads[:, None] * stride_qh + offs_h[None, :]
    q_lo = product_operand(tl.load(q_row, mask=gh_mask, other=0.0), F16_PRODUCTS)
    q_hi = product_operand(tl.load(q_row + HALF, mask=gh_mask, other=0.0), F16_PRODUCTS)

    bt_row = block_tables_ptr + seq.to(tl.int64) * stride_bt
    code_head_off = kv_head.to(tl.int64) * stride_ch
    window_lo = 0
    if USE_WINDOW:
        window_lo = first_visible_key(seq_len - 1, window, CHUNKED)
    m_i = tl.full([G_PAD], -1.0e30, tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc_lo = tl.zeros([G_PAD, H_PAD], tl.float32)
    acc_hi = tl.zeros([G_PAD, H_PAD], tl.float32)
    # The scales (2 bytes per token: too narrow for the asynchronous copies that bring the
    # code tiles in ahead of use) are read one tile ahead, so that their latency overlaps a
    # tile's work instead of stalling the scores.
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
        code_off, _ = turbo_offsets(
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
        k_lo, k_hi = load_nibble_halves(
            k_codes_ptr, code_off, offs_n, n_mask, offs_h, HALF, UNPACK_IN_PTX, q_lo.dtype
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
        s = dot(q_lo, tl.trans(k_lo), PRECISION, UPCAST) + dot(
            q_hi, tl.trans(k_hi), PRECISION, UPCAST
        )
        s = s * k_scale[None, :]
        if USE_SOFTCAP:
            s = softcap * tanh(s * qk_scale)
        else:
            s = s * qk_scale
        s = tl.where(n_mask[None, :], s, float("-inf"))
        v_lo, v_hi = load_nibble_halves(
            v_codes_ptr, code_off, offs_n, n_mask, offs_h, HALF, UNPACK_IN_PTX, q_lo.dtype
        )
        pv, alpha, l_i, m_i = scaled_weights(l_i, m_i, s, v_scale, v_lo.dtype)
        acc_lo = acc_lo * alpha[:, None] + dot(pv, v_lo, PRECISION, UPCAST)
        acc_hi = acc_hi * alpha[:, None] + dot(pv, v_hi, PRECISION, UPCAST)
        k_scale = next_k_scale
        v_scale = next_v_scale

    if SINGLE_SPLIT:
        l_i += sink_mass(sinks_ptr, heads, m_i, g_mask, USE_SINKS)
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)  # an empty context (padding) gives zeros
        dst = out_ptr + row64 * stride_ot + heads[:, None] * stride_oh + offs_h[None, :]
        out_ty = out_ptr.dtype.element_ty
        tl.store(dst, (acc_lo / l_safe[:, None]).to(out_ty), mask=gh_mask)
        tl.store(dst + HALF, (acc_hi / l_safe[:, None]).to(out_ty), mask=gh_mask)
    else:
        # partials as decode_split_kernel lays them out: acc [B, Hq, S, D_PAD] (columns from
        # HEAD_DIM on unwritten, never read into the output), (max, sum) [B, Hq, S, 2]
        part = (seq.to(tl.int64) * NUM_Q_HEADS + heads) * num_splits + split
        dst = part_acc_ptr + part[:, None] * D_PAD + offs_h[None, :]
        tl.store(dst, acc_lo, mask=gh_mask)
        tl.store(dst + HALF, acc_hi, mask=gh_mask)
        tl.store(part_ml_ptr + part * 2, m_i, mask=g_mask)
        tl.store(part_ml_ptr + part * 2 + 1, l_i, mask=g_mask)
