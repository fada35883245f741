"""Storing new keys and values into a cast codec's paged cache by slot mapping.

A cast codec (:class:`tallow.kernels.kv_cast.CastKVCodec` without per-head scales or centred
keys: ``auto``, ``fp8``, ``fp8_e5m2``) lays out paged ``k`` and ``v`` tensors of
``[blocks, block_size, Hkv, D]`` and stores each value cast into their dtype
(:func:`tallow.kernels.kv_cache.to_cache_dtype`). :func:`store_cast_kv` does that write for
attention backends whose own kernels only read the cache (FlashInfer's): a Triton kernel on
CUDA, which a CUDA graph can capture, and :func:`store_cast_kv_ref` elsewhere.
"""

from __future__ import annotations

import torch

from ._dispatch import triton_enabled
from .kv_cache import float8_reasons, indexable, to_cache_dtype


def check_store_cast_kv_args(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Raise ValueError naming the argument whose shape or dtype does not fit."""
    if k_cache.dim() != 4 or v_cache.shape != k_cache.shape or v_cache.dtype != k_cache.dtype:
        raise ValueError(
            "k_cache and v_cache: expected two [blocks, block_size, Hkv, D] "
            f"tensors of one shape and dtype, got {tuple(k_cache.shape)} "
            f"{k_cache.dtype} and {tuple(v_cache.shape)} {v_cache.dtype}"
        )
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous tensor")
    want = tuple(k_cache.shape[2:])
    for name, t in (("k", k), ("v", v)):
        if t.dim() != 3 or tuple(t.shape[1:]) != want:
            raise ValueError(f"{name}: expected [T, {want[0]}, {want[1]}], got {tuple(t.shape)}")
    if k.shape[0] != v.shape[0] or slot_mapping.shape != (k.shape[0],):
        raise ValueError(
            f"slot_mapping: expected [{k.shape[0]}] (one slot per token of k and "
            f"v), got {tuple(slot_mapping.shape)} with v {tuple(v.shape)}"
        )
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slot_mapping: expected int32 or int64, got {slot_mapping.dtype}")


def store_cast_kv_ref(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Reference of :func:`store_cast_kv`: token ``i`` goes to flat slot ``slot_mapping[i]``
    (block * block_size + offset; -1: skipped), cast as the cast codecs' ``encode`` does."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    for cache, x in ((k_cache, k), (v_cache, v)):
        flat = indexable(cache).view(-1, *cache.shape[2:])
        flat[slots] = indexable(to_cache_dtype(x[keep], cache.dtype))


def store_cast_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``k``/``v`` [T, Hkv, D] into ``k_cache``/``v_cache`` [blocks, block_size, Hkv, D]
    at ``slot_mapping`` [T] (slot = block * block_size + offset; -1 = skip that token, as the
    padding rows of a CUDA graph are), cast into the caches' dtype. The Triton kernel on CUDA
    (where Triton converts to that dtype), :func:`store_cast_kv_ref` elsewhere."""
    check_store_cast_kv_args(k_cache, v_cache, k, v, slot_mapping)
    if k.shape[0] == 0:
        return
    if triton_enabled(k_cache) and not _triton_cannot_convert(k_cache):
        from ._kv_store_triton import store_cast_kv_triton

        store_cast_kv_triton(k_cache, v_cache, k, v, slot_mapping)
    else:
        store_cast_kv_ref(k_cache, v_cache, k, v, slot_mapping)


def _triton_cannot_convert(cache: torch.Tensor) -> bool:
    if not cache.is_cuda:
        return False
    return bool(float8_reasons(cache.dtype, tuple(torch.cuda.get_device_capability(cache.device))))
