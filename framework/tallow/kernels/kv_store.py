"""Writing new keys and values into the paged KV cache by slot mapping."""

from __future__ import annotations

import torch

from ._dispatch import triton_enabled
from .attention_ref import store_kv_ref


def check_store_kv_args(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        slot_mapping: torch.Tensor) -> None:
    """Raise ValueError naming the argument whose shape or dtype does not fit."""
    if kv_cache.dim() != 5 or kv_cache.shape[0] != 2:
        raise ValueError(f"kv_cache: expected [2, blocks, block_size, Hkv, D], got "
                         f"{tuple(kv_cache.shape)}")
    want = tuple(kv_cache.shape[3:])
    for name, t in (("k", k), ("v", v)):
        if t.dim() != 3 or tuple(t.shape[1:]) != want:
            raise ValueError(f"{name}: expected [T, {want[0]}, {want[1]}], got {tuple(t.shape)}")
    if k.shape[0] != v.shape[0] or slot_mapping.shape != (k.shape[0],):
        raise ValueError(f"slot_mapping: expected [{k.shape[0]}] (one slot per token of k and "
                         f"v), got {tuple(slot_mapping.shape)} with v {tuple(v.shape)}")
    if slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slot_mapping: expected int32 or int64, got {slot_mapping.dtype}")


def store_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Write ``k``/``v`` [T, Hkv, D] into ``kv_cache`` [2, blocks, block_size, Hkv, D] at
    ``slot_mapping`` [T] (slot = block * block_size + offset; -1 = skip that token), casting to
    the cache dtype. The Triton kernel on CUDA, ``attention_ref.store_kv_ref`` elsewhere."""
    check_store_kv_args(kv_cache, k, v, slot_mapping)
    if k.shape[0] == 0:
        return
    if triton_enabled(kv_cache) and not _e4m3_unsupported(kv_cache):
        from .kv_store_triton import store_kv_triton
        store_kv_triton(kv_cache, k, v, slot_mapping)
    else:
        store_kv_ref(kv_cache, k, v, slot_mapping)


#: lowest CUDA compute capability (Ada) where Triton converts to and from float8_e4m3fn
E4M3_MIN_CAPABILITY = (8, 9)


def _e4m3_unsupported(kv_cache: torch.Tensor) -> bool:
    """Triton has no float8_e4m3fn conversions below :data:`E4M3_MIN_CAPABILITY`."""
    return (kv_cache.dtype == torch.float8_e4m3fn and kv_cache.is_cuda
            and torch.cuda.get_device_capability(kv_cache.device) < E4M3_MIN_CAPABILITY)
