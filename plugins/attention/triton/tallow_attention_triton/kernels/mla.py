"""Latent attention (MLA) kernels: the store of a step's latent rows, and split-K decode with
the up-projections absorbed (the latent rows are read once per block of heads, not expanded
into per-head keys and values).

A latent cache is ``[blocks, block_size, RANK + ROPE]``: per token the compressed K/V ``c``
then the rotated key part ``k_pe``. The decode kernel takes the latent queries ``q_lat``
[T, H, RANK] (``q_nope`` through ``W_UK``) and ``q_pe`` [T, H, ROPE]; head ``h``'s score of
token ``j`` is ``q_lat[h] . c_j + q_pe[h] . k_pe_j`` and its output the softmax-weighted sum of
the ``c_j`` (``W_UV`` is applied to it afterwards, on the host side of the launch).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .common import dot, saturate


@triton.jit
def store_latent_kernel(
    latent_ptr,
    cache_ptr,
    slot_ptr,
    stride_lt,
    stride_cb,
    stride_co,
    WIDTH: tl.constexpr,
    W_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    SATURATE: tl.constexpr,
):
    """Grid (tokens,): row ``t`` of ``latent`` to cache slot ``slot[t]`` (< 0: skipped),
    converted to the cache's dtype (clamped to +-SATURATE first when it is > 0)."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    offs = tl.arange(0, W_PAD)
    mask = offs < WIDTH
    row = tl.load(latent_ptr + t * stride_lt + offs, mask=mask)
    dst = (slot // BLOCK_SIZE) * stride_cb + (slot % BLOCK_SIZE) * stride_co + offs
    tl.store(cache_ptr + dst, saturate(row, SATURATE).to(cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def mla_decode_split_kernel(
    q_lat_ptr,
    q_pe_ptr,
    cache_ptr,
    seq_lens_ptr,
    block_tables_ptr,
    qsl_ptr,
    acc_ptr,
    ml_ptr,
    stride_qt,
    stride_qh,
    stride_pt,
    stride_ph,
    stride_cb,
    stride_co,
    stride_bt,
    qk_scale,
    NUM_HEADS: tl.constexpr,
    RANK: tl.constexpr,
    ROPE: tl.constexpr,
    R_PAD: tl.constexpr,
    P_PAD: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
    MIXED: tl.constexpr,
):
    """Grid (sequences, cdiv(H, BLOCK_H), NUM_SPLITS). Program (i, hb, s) attends the heads
    ``hb * BLOCK_H ...`` of sequence ``i``'s query over split ``s`` of its
    ``seq_lens[i]`` latent rows, and writes the unnormalised sum ``acc`` [BLOCK_H, RANK]
    (float32) and the running max and denominator (log2 domain) to the partials
    ``acc_ptr`` [T, S, H, RANK] and ``ml_ptr`` [T, S, H, 2]. An empty split writes max -inf.
    Scores are ``(q_lat . c + q_pe . k_pe) * qk_scale`` with qk_scale = scale * log2(e).
    The query is row ``i``; with ``MIXED`` (a step with prompts too) it is row
    ``qsl[i]``, and sequences with more than one query are left to the caller."""
    seq = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1)
    split = tl.program_id(2)
    row = seq
    if MIXED:
        row = tl.load(qsl_ptr + seq).to(tl.int64)
        if tl.load(qsl_ptr + seq + 1) - row != 1:
            return
    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_r = tl.arange(0, R_PAD)
    offs_p = tl.arange(0, P_PAD)
    h_mask = offs_h < NUM_HEADS
    r_mask = offs_r < RANK
    p_mask = offs_p < ROPE
    q_lat = tl.load(
        q_lat_ptr + row * stride_qt + offs_h[:, None] * stride_qh + offs_r[None, :],
        mask=h_mask[:, None] & r_mask[None, :],
        other=0.0,
    )
    q_pe = tl.load(
        q_pe_ptr + row * stride_pt + offs_h[:, None] * stride_ph + offs_p[None, :],
        mask=h_mask[:, None] & p_mask[None, :],
        other=0.0,
    )
    seq_len = tl.load(seq_lens_ptr + seq)
    # this split's share of the context, in whole key tiles
    tiles = tl.cdiv(seq_len, BLOCK_N)
    per_split = tl.cdiv(tiles, NUM_SPLITS)
    start = split * per_split * BLOCK_N
    end = tl.minimum(start + per_split * BLOCK_N, seq_len)
    m = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, R_PAD], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end
        block = tl.load(
            block_tables_ptr + seq * stride_bt + offs_n // BLOCK_SIZE, mask=n_mask, other=0
        ).to(tl.int64)
        rows = block * stride_cb + (offs_n % BLOCK_SIZE) * stride_co
        c = tl.load(
            cache_ptr + rows[:, None] + offs_r[None, :],
            mask=n_mask[:, None] & r_mask[None, :],
            other=0.0,
        ).to(q_lat.dtype)
        pe = tl.load(
            cache_ptr + rows[:, None] + RANK + offs_p[None, :],
            mask=n_mask[:, None] & p_mask[None, :],
            other=0.0,
        ).to(q_pe.dtype)
        s = dot(q_lat, tl.trans(c), PRECISION, UPCAST) + dot(q_pe, tl.trans(pe), PRECISION, UPCAST)
        s = tl.where(n_mask[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + dot(p.to(c.dtype), c, PRECISION, UPCAST)
        m = m_new
    part = (seq * NUM_SPLITS + split) * NUM_HEADS + offs_h
    tl.store(
        acc_ptr + part[:, None] * RANK + offs_r[None, :],
        acc,
        mask=h_mask[:, None] & r_mask[None, :],
    )
    tl.store(ml_ptr + part * 2, m, mask=h_mask)
    tl.store(ml_ptr + part * 2 + 1, l, mask=h_mask)


@triton.jit
def mla_decode_reduce_kernel(
    acc_ptr,
    ml_ptr,
    out_ptr,
    qsl_ptr,
    stride_ot,
    stride_oh,
    NUM_HEADS: tl.constexpr,
    RANK: tl.constexpr,
    R_PAD: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    S_PAD: tl.constexpr,
    MIXED: tl.constexpr,
):
    """Grid (sequences, H): the splits' partials of one head combined into its latent output
    ``out`` [T, H, RANK] (float32) at the sequence's query row (as the split kernel)."""
    seq = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    row = seq
    if MIXED:
        row = tl.load(qsl_ptr + seq).to(tl.int64)
        if tl.load(qsl_ptr + seq + 1) - row != 1:
            return
    offs_s = tl.arange(0, S_PAD)
    offs_r = tl.arange(0, R_PAD)
    s_mask = offs_s < NUM_SPLITS
    part = (seq * NUM_SPLITS + offs_s) * NUM_HEADS + h
    m = tl.load(ml_ptr + part * 2, mask=s_mask, other=float("-inf"))
    l = tl.load(ml_ptr + part * 2 + 1, mask=s_mask, other=0.0)
    m_all = tl.max(m, axis=0)
    weight = tl.where(m > float("-inf"), tl.exp2(m - m_all), 0.0)
    acc = tl.load(
        acc_ptr + part[:, None] * RANK + offs_r[None, :],
        mask=s_mask[:, None] & (offs_r < RANK)[None, :],
        other=0.0,
    )
    out = tl.sum(acc * weight[:, None], axis=0) / tl.sum(l * weight, axis=0)
    tl.store(out_ptr + row * stride_ot + h * stride_oh + offs_r, out, mask=offs_r < RANK)
