"""The opt-in tensor-core path (setting ``kernel: tensor_core``): each :class:`FP4Weight`
re-laid once into the packed GEMM's layout (:class:`tallow.kernels.PackedGemmWeight`, kind
``e2m1``: the codes 8 to an int32 along K, each group's scale as a float) and every product on a
GPU run by :func:`tallow.kernels.packed_gemm`.

The scales are :func:`tallow_quant_fp4.layout.scale_values` (MXFP4: ``2 ** (e - 127)``, kept in
bfloat16, which holds every such power exactly; NVFP4: the e4m3 value over the global scale,
in float32), so the packed copy decodes to ``value(code) * scale`` in float32, the bits of
:func:`tallow_quant_fp4.layout.dequantize`.
"""

from __future__ import annotations

import torch

from tallow.kernels import PackedGemmWeight, packed_weight, triton_enabled

from .layout import FP4Weight, scale_values, unpack_quads

#: the activations' dtypes the tensor-core kernel multiplies
DTYPES = (torch.float16, torch.bfloat16)


def to_packed(w: FP4Weight) -> PackedGemmWeight:
    """``w`` in the packed GEMM's layout."""
    scales = scale_values(w.kind, w.scales, w.global_scale)
    if w.kind == "mxfp4":
        scales = scales.to(torch.bfloat16)
    return packed_weight("e2m1", unpack_quads(w.codes, 4), scales, group=w.group)


def applies(x: torch.Tensor, parts: list) -> bool:
    """Whether the tensor-core path takes ``x`` times ``parts``: Triton runs for x, x is 16-bit
    and every part is an :class:`FP4Weight`."""
    return triton_enabled(x) and x.dtype in DTYPES and all(isinstance(p, FP4Weight) for p in parts)
