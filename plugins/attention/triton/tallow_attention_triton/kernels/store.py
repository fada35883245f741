"""Write this step's K and V into the paged cache at their slots."""

from __future__ import annotations

import triton.language as tl

from tallow.kernels import allow_next, step_jit, wait_prior

from .common import saturate


# The slot mapping is a slice of a packed per-step buffer: its alignment varies.
@step_jit(pointers=["slot_ptr"])
def store_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    k_scale_ptr,
    v_scale_ptr,
    k_offset_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_co,
    stride_ch,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEADS_PER_PROGRAM: tl.constexpr,
    D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    SATURATE: tl.constexpr,
    HEAD_SCALES: tl.constexpr,
    KEY_OFFSET: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Grid (tokens, cdiv(Hkv, HEADS_PER_PROGRAM)). Token ``t`` goes to cache slot
    ``slot[t]`` (block ``slot // BLOCK_SIZE``, offset ``slot % BLOCK_SIZE``); slot < 0 skips it.
    Values are converted to the cache's dtype, clamped to +-SATURATE first when it is > 0 (an
    8-bit float cache, which has no infinity); with ``HEAD_SCALES`` they are divided by their
    head's scale (``k_scale_ptr``/``v_scale_ptr``, float32 [Hkv]) first, and with
    ``KEY_OFFSET`` keys have their head's offset (``k_offset_ptr``, float32 [Hkv, HEAD_DIM])
    subtracted before that."""
    wait_prior(USE_PDL)  # slots, K and V are earlier kernels' output
    allow_next(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    head0 = tl.program_id(1) * HEADS_PER_PROGRAM
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    offs_h = head0 + tl.arange(0, HEADS_PER_PROGRAM)
    offs_d = tl.arange(0, D_PAD)
    mask = (offs_h < NUM_KV_HEADS)[:, None] & (offs_d < HEAD_DIM)[None, :]
    dst = blk * stride_cb + off * stride_co + offs_h[:, None] * stride_ch + offs_d[None, :]
    k = tl.load(k_ptr + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=mask)
    if KEY_OFFSET:
        k = k.to(tl.float32) - tl.load(
            k_offset_ptr + offs_h[:, None] * HEAD_DIM + offs_d[None, :], mask=mask, other=0.0
        )
    if HEAD_SCALES:
        k = tl.math.div_rn(
            k.to(tl.float32),
            tl.load(k_scale_ptr + offs_h, mask=offs_h < NUM_KV_HEADS, other=1.0)[:, None],
        )
    tl.store(k_cache_ptr + dst, saturate(k, SATURATE).to(k_cache_ptr.dtype.element_ty), mask=mask)
    v = tl.load(v_ptr + t * stride_vt + offs_h[:, None] * stride_vh + offs_d[None, :], mask=mask)
    if HEAD_SCALES:
        v = tl.math.div_rn(
            v.to(tl.float32),
            tl.load(v_scale_ptr + offs_h, mask=offs_h < NUM_KV_HEADS, other=1.0)[:, None],
        )
    tl.store(v_cache_ptr + dst, saturate(v, SATURATE).to(v_cache_ptr.dtype.element_ty), mask=mask)
