"""Triton KV-cache store: one program per token copies its K and V rows into their slot."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .attention_ref import cache_saturation
from .jit import step_jit
from .pdl import allow_next, pdl_enabled, wait_prior


@triton.jit
def saturate(x, LIMIT: tl.constexpr):
    """``x`` clamped to [-LIMIT, LIMIT] (in fp32) when LIMIT > 0, else unchanged: values bound
    for an 8-bit float cache, whose casts have no infinity to overflow to (LIMIT is
    :func:`tallow.kernels.attention_ref.cache_saturation` of the cache dtype)."""
    if LIMIT > 0:
        x = tl.minimum(tl.maximum(x.to(tl.float32), -LIMIT), LIMIT)
    return x


# The slot mapping is a slice of a packed per-step buffer: its alignment varies (see jit.py).
@step_jit(pointers=["slot_ptr"])
def _store_kv_kernel(k_ptr, v_ptr, cache_ptr, slot_ptr, k_stride, v_stride, cache_half,
                     width, BLOCK: tl.constexpr, SATURATE: tl.constexpr, USE_PDL: tl.constexpr):
    tok = tl.program_id(0)
    wait_prior(USE_PDL)  # everything below reads or writes this step's tensors
    allow_next(USE_PDL)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot >= 0:
        offs = tl.arange(0, BLOCK)
        mask = offs < width
        # slot = block * block_size + offset and a cache row is `width` wide, so the flat
        # position of (block, offset) is slot * width whatever block_size is.
        dst = cache_ptr + slot * width + offs
        k = tl.load(k_ptr + tok.to(tl.int64) * k_stride + offs, mask=mask)
        v = tl.load(v_ptr + tok.to(tl.int64) * v_stride + offs, mask=mask)
        tl.store(dst, saturate(k, SATURATE).to(cache_ptr.dtype.element_ty), mask=mask)
        tl.store(dst + cache_half, saturate(v, SATURATE).to(cache_ptr.dtype.element_ty),
                 mask=mask)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` [T, H, D] with each token's H*D values contiguous (any token stride)."""
    if t.stride(2) == 1 and t.stride(1) == t.shape[2]:
        return t
    return t.contiguous()


def store_kv_triton(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    slot_mapping: torch.Tensor) -> None:
    """Triton version of ``attention_ref.store_kv_ref`` (arguments already checked)."""
    if not kv_cache.is_contiguous():
        raise ValueError("kv_cache: expected a contiguous tensor")
    k, v = _rows(k), _rows(v)
    n_tokens = k.shape[0]
    width = k.shape[1] * k.shape[2]
    use_pdl = pdl_enabled(kv_cache)
    _store_kv_kernel[(n_tokens,)](
        k, v, kv_cache, slot_mapping.contiguous(), k.stride(0), v.stride(0),
        kv_cache[0].numel(), width,
        BLOCK=triton.next_power_of_2(width), SATURATE=cache_saturation(kv_cache.dtype),
        USE_PDL=use_pdl, launch_pdl=use_pdl)
