"""The opt-in tensor-core path (setting ``matmul: tensor_core``): weights of the types listed in
:data:`TYPES` re-laid once into the packed GEMM's layout (:class:`tallow.kernels.
PackedGemmWeight`) and multiplied by :func:`tallow.kernels.packed_gemm` at every row count.

The re-layout keeps each element's decoding, ``S * (q - offset) - M`` in float32 with the
group's scale ``S`` and min ``M`` as :func:`tallow_quant_gguf.reference.group_scales` computes
them (Q4_K: ``d * sc`` and ``dm * mn``, exact float32 products of a float16 and a 6-bit
integer), so it decodes to the bits of :func:`tallow_quant_gguf.reference.dequantize_ref`.
Scales and mins are stored in float16 where that holds them exactly (the block types' ``d``
and ``dm``), else in float32 (the K-quants' products). A layer with a part of another type
keeps the default kernels.
"""

from __future__ import annotations

import torch

from tallow.kernels import PackedGemmWeight, packed_weight, triton_enabled

from .packing import PackedWeight
from .reference import codes, group_scales

#: GGML type -> the packed layout's code kind
TYPES = {"Q4_0": "u4", "Q4_1": "u4", "Q4_K": "u4", "Q8_0": "u8"}
#: the activations' dtypes the tensor-core kernel multiplies
DTYPES = (torch.float16, torch.bfloat16)


def _compact(t: torch.Tensor) -> torch.Tensor:
    """``t`` (float32) as float16 when that keeps every value (NaN stays NaN), else as it
    is."""
    half = t.to(torch.float16)
    kept = (half.to(torch.float32) == t) | torch.isnan(t)
    return half if bool(kept.all()) else t


def to_packed(p: PackedWeight) -> PackedGemmWeight:
    """``p`` (a type of :data:`TYPES`) in the packed GEMM's layout."""
    name = p.type_name
    if p.qtype is None or name not in TYPES:
        raise ValueError(f"the tensor-core path takes GGML types {', '.join(TYPES)}, not {name}")
    scale, low_min = group_scales(p)
    return packed_weight(
        TYPES[name],
        codes(p),
        _compact(scale),
        group=p.qtype.group,
        zero_point=float(p.qtype.offset),
        mins=None if low_min is None else _compact(low_min),
    )


def applies(x: torch.Tensor, parts: list[PackedWeight]) -> bool:
    """Whether the tensor-core path takes ``x`` times ``parts``: Triton runs for x, x is 16-bit
    and every part's type is one of :data:`TYPES`."""
    return (
        triton_enabled(x)
        and x.dtype in DTYPES
        and all(p.qtype is not None and p.type_name in TYPES for p in parts)
    )
