"""Triton store of a cast codec's cache: one program per token copies its K and V rows into
their slot (:func:`tallow.kernels.kv_store.store_cast_kv`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .jit import step_jit
from .kv_cache import cache_saturation
from .pdl import allow_next, pdl_enabled, wait_prior


@triton.jit
def _saturate(x, LIMIT: tl.constexpr):
    """``x`` clamped to [-LIMIT, LIMIT] (in fp32) when LIMIT > 0, else unchanged: values bound
    for an 8-bit float cache, whose casts have no infinity to overflow to."""
    if LIMIT > 0:
        x = tl.minimum(tl.maximum(x.to(tl.float32), -LIMIT), LIMIT)
    return x


# The slot mapping is a slice of a packed per-step buffer: its alignment varies (see jit.py).
@step_jit(pointers=["slot_ptr"])
def _store_cast_kv_kernel(
    k_ptr,
    v_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    k_stride,
    v_stride,
    width,
    BLOCK: tl.constexpr,
    SATURATE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    tok = tl.program_id(0)
    wait_prior(USE_PDL)  # everything below reads or writes this step's tensors
    allow_next(USE_PDL)
    slot = tl.load(slot_ptr + tok).to(tl.int64)
    if slot >= 0:
        offs = tl.arange(0, BLOCK)
        mask = offs < width
        # slot = block * block_size + offset and a cache row is `width` wide, so the flat
        # position of (block, offset) is slot * width whatever block_size is.
        k = tl.load(k_ptr + tok.to(tl.int64) * k_stride + offs, mask=mask)
        v = tl.load(v_ptr + tok.to(tl.int64) * v_stride + offs, mask=mask)
        tl.store(
            k_cache_ptr + slot * width + offs,
            _saturate(k, SATURATE).to(k_cache_ptr.dtype.element_ty),
            mask=mask,
        )
        tl.store(
            v_cache_ptr + slot * width + offs,
            _saturate(v, SATURATE).to(v_cache_ptr.dtype.element_ty),
            mask=mask,
        )


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` [T, H, D] with each token's H*D values contiguous (any token stride)."""
    if t.stride(2) == 1 and t.stride(1) == t.shape[2]:
        return t
    return t.contiguous()


def store_cast_kv_triton(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Triton version of :func:`tallow.kernels.kv_store.store_cast_kv_ref` (arguments
    already checked)."""
    k, v = _rows(k), _rows(v)
    width = k.shape[1] * k.shape[2]
    use_pdl = pdl_enabled(k_cache)
    _store_cast_kv_kernel[(k.shape[0],)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping.contiguous(),
        k.stride(0),
        v.stride(0),
        width,
        BLOCK=triton.next_power_of_2(width),
        SATURATE=cache_saturation(k_cache.dtype),
        USE_PDL=use_pdl,
        launch_pdl=use_pdl,
    )
