"""Triton rotary embedding: one program per token rotates all its q heads and k heads."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .jit import step_jit
from .pdl import allow_next, pdl_enabled, wait_prior


@triton.jit
def _rotate_heads(
    x_ptr,
    row_stride,
    tok,
    n_heads,
    cos,
    sin,
    head_size,
    w_ptr,
    eps,
    HALF: tl.constexpr,
    IS_NEOX: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_R: tl.constexpr,
    HAS_NORM: tl.constexpr,
):
    heads = tl.arange(0, BLOCK_H)[:, None]
    i = tl.arange(0, BLOCK_R)[None, :]
    mask = (heads < n_heads) & (i < HALF)
    base = x_ptr + tok * row_stride + heads * head_size
    if IS_NEOX:
        a_ptr = base + i
        b_ptr = base + i + HALF
    else:
        a_ptr = base + 2 * i
        b_ptr = base + 2 * i + 1
    a = tl.load(a_ptr, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr, mask=mask, other=0.0).to(tl.float32)
    if HAS_NORM:
        # Per-head RMSNorm first (rotary covers the whole head here): statistics in float32,
        # the normalised value rounded to the input dtype, times the weight, rounded again —
        # what the RMSNorm kernel followed by the rotary kernel computes.
        dtype = x_ptr.dtype.element_ty
        rstd = tl.math.rsqrt((tl.sum(a * a, axis=1) + tl.sum(b * b, axis=1)) / head_size + eps)
        if IS_NEOX:
            wa = tl.load(w_ptr + i, mask=i < HALF, other=0.0).to(tl.float32)
            wb = tl.load(w_ptr + i + HALF, mask=i < HALF, other=0.0).to(tl.float32)
        else:
            wa = tl.load(w_ptr + 2 * i, mask=i < HALF, other=0.0).to(tl.float32)
            wb = tl.load(w_ptr + 2 * i + 1, mask=i < HALF, other=0.0).to(tl.float32)
        a = ((a * rstd[:, None]).to(dtype).to(tl.float32) * wa).to(dtype).to(tl.float32)
        b = ((b * rstd[:, None]).to(dtype).to(tl.float32) * wb).to(dtype).to(tl.float32)
    a_out = a * cos - b * sin
    b_out = b * cos + a * sin
    tl.store(a_ptr, a_out.to(x_ptr.dtype.element_ty), mask=mask)
    tl.store(b_ptr, b_out.to(x_ptr.dtype.element_ty), mask=mask)


# Positions are a slice of a packed per-step buffer: their alignment varies (see jit.py).
@step_jit(pointers=["pos_ptr"])
def _rotary_kernel(
    pos_ptr,
    q_ptr,
    k_ptr,
    cache_ptr,
    q_stride,
    k_stride,
    cache_stride,
    n_q_heads,
    n_k_heads,
    head_size,
    qw_ptr,
    kw_ptr,
    eps,
    HALF: tl.constexpr,
    IS_NEOX: tl.constexpr,
    HAS_K: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_R: tl.constexpr,
    HAS_NORM: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    # Even the cos/sin row depends on this step's positions: nothing to read before the wait.
    wait_prior(USE_PDL)
    allow_next(USE_PDL)
    pos = tl.load(pos_ptr + tok).to(tl.int64)
    i = tl.arange(0, BLOCK_R)[None, :]
    row = cache_ptr + pos * cache_stride
    cos = tl.load(row + i, mask=i < HALF, other=0.0).to(tl.float32)
    sin = tl.load(row + HALF + i, mask=i < HALF, other=0.0).to(tl.float32)
    _rotate_heads(
        q_ptr,
        q_stride,
        tok,
        n_q_heads,
        cos,
        sin,
        head_size,
        qw_ptr,
        eps,
        HALF,
        IS_NEOX,
        BLOCK_HQ,
        BLOCK_R,
        HAS_NORM,
    )
    if HAS_K:
        _rotate_heads(
            k_ptr,
            k_stride,
            tok,
            n_k_heads,
            cos,
            sin,
            head_size,
            kw_ptr,
            eps,
            HALF,
            IS_NEOX,
            BLOCK_HK,
            BLOCK_R,
            HAS_NORM,
        )


def rotary_embedding_triton(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    head_size: int,
    is_neox: bool = True,
    inplace: bool = True,
    qk_norm: tuple[torch.Tensor, torch.Tensor] | None = None,
    norm_eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Triton version of ``rotary.rotary_embedding_ref`` (arguments already checked; with
    ``qk_norm`` the rotary dim is the whole head)."""
    if not inplace:
        q = q.clone()
        k = k.clone() if k is not None else None
    n_tokens = positions.shape[0]
    q3 = q.view(n_tokens, -1, head_size)
    k3 = k.view(n_tokens, -1, head_size) if k is not None else q3
    cache = cos_sin_cache if cos_sin_cache.stride(1) == 1 else cos_sin_cache.contiguous()
    half = cache.shape[1] // 2
    qw, kw = (qk_norm[0].contiguous(), qk_norm[1].contiguous()) if qk_norm else (cache, cache)
    use_pdl = pdl_enabled(q)
    _rotary_kernel[(n_tokens,)](
        positions,
        q3,
        k3,
        cache,
        q3.stride(0),
        k3.stride(0),
        cache.stride(0),
        q3.shape[1],
        k3.shape[1],
        head_size,
        qw,
        kw,
        float(norm_eps),
        HALF=half,
        IS_NEOX=bool(is_neox),
        HAS_K=k is not None,
        BLOCK_HQ=triton.next_power_of_2(q3.shape[1]),
        BLOCK_HK=triton.next_power_of_2(k3.shape[1]),
        BLOCK_R=triton.next_power_of_2(half),
        HAS_NORM=qk_norm is not None,
        USE_PDL=use_pdl,
        launch_pdl=use_pdl,
    )
    return q, k
