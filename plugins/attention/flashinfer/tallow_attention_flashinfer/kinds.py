"""What one FlashInfer plan serves, which kernels run it, and which JIT modules those are.

Layers whose :class:`LayerKind` is equal share a step's plan: the kind fixes everything the
plan and the compiled module depend on (head counts and size, scale, window, softcap, causal
mask, activation and cache dtypes). A model whose layers alternate sliding-window and global
attention (Gemma) has two kinds, so two plans per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from tallow.layers import AttentionLayer

#: head sizes the backend serves: those FlashInfer's kernels are built and tested for
HEAD_DIMS = (64, 128, 256)
#: query heads per KV head that FlashInfer's CUDA-core decode kernel is compiled for (its
#: tensor-core path takes any)
CUDA_CORE_DECODE_GROUPS = (1, 2, 3, 4, 8)
#: activation dtypes of the kernels
ACTIVATION_DTYPES = (torch.float16, torch.bfloat16)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
#: cache dtypes the kernels read: the activations' own 16-bit dtype or an 8-bit float
CACHE_DTYPES = ACTIVATION_DTYPES + FP8_DTYPES


def window_left(sliding_window: int | None) -> int:
    """FlashInfer's ``window_left`` for tallow's ``sliding_window``: tallow's window counts the
    query's own key (a query at position p sees keys p - window + 1 ... p), FlashInfer's counts
    the keys left of it (p - window_left ... p); -1 is no window."""
    return sliding_window - 1 if sliding_window else -1


@dataclass(frozen=True)
class LayerKind:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    window_left: int  # -1: no window
    softcap: float  # 0.0: none
    causal: bool
    q_dtype: torch.dtype
    kv_dtype: torch.dtype

    @classmethod
    def of(cls, layer: AttentionLayer, q_dtype: torch.dtype, kv_dtype: torch.dtype) -> "LayerKind":
        return cls(
            num_heads=layer.num_heads,
            num_kv_heads=layer.num_kv_heads,
            head_dim=layer.head_dim,
            scale=float(layer.scale),
            window_left=window_left(layer.sliding_window),
            softcap=float(layer.logit_softcap or 0.0),
            causal=layer.causal,
            q_dtype=q_dtype,
            kv_dtype=kv_dtype,
        )

    @property
    def group(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def fp8_cache(self) -> bool:
        return self.kv_dtype in FP8_DTYPES


def decode_on_tensor_cores(kind: LayerKind, setting: str) -> bool:
    """Whether decode-only steps of ``kind`` run FlashInfer's tensor-core path (``setting``:
    ``decode_tensor_cores``). Many query heads per KV head fill the tensor cores' rows, and an
    8-bit cache is widened there once per tile; groups the CUDA-core kernel was not compiled
    for go there too."""
    if setting == "always" or kind.group not in CUDA_CORE_DECODE_GROUPS:
        return True
    if setting == "never":
        return False
    return kind.group >= 4 or kind.fp8_cache


def prefill_kernels(kind: LayerKind, setting: str, capability: tuple[int, int]) -> str:
    """ "fa3" or "fa2" for steps with prompts (``setting``: ``prefill_backend``). FA3 needs
    Hopper (compute capability 9.x) and reads an 8-bit cache only with 8-bit queries."""
    if setting != "auto":
        return setting
    return "fa3" if capability[0] == 9 and not kind.fp8_cache else "fa2"


def jit_specs(kind: LayerKind, prefill: str, tensor_core_decode: bool) -> list[Any]:
    """FlashInfer's JIT specs of the modules ``kind`` runs on (the same arguments its wrappers
    pass, so building them here compiles exactly what they load)."""
    from flashinfer.jit.attention.modules import gen_batch_decode_module, gen_batch_prefill_module

    common = (
        kind.q_dtype,
        kind.kv_dtype,
        kind.q_dtype,
        torch.int32,
        kind.head_dim,
        kind.head_dim,
        0,
    )
    flags = (kind.window_left >= 0, kind.softcap > 0)
    specs = [gen_batch_prefill_module(prefill, *common, *flags, False)]
    if tensor_core_decode:
        if prefill != "fa2":
            specs.append(gen_batch_prefill_module("fa2", *common, *flags, False))
    else:
        specs.append(gen_batch_decode_module(*common, *flags))
    return specs
