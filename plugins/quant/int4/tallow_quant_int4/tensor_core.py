"""The opt-in tensor-core path (setting ``kernel: tensor_core``): each :class:`IntWeight` re-laid
once into the packed GEMM's layout (:class:`tallow.kernels.PackedGemmWeight`), and every matmul
on a GPU run by :func:`tallow.kernels.packed_gemm`, whatever its row count (split-K for a few
rows, no bf16 workspace for many).

The packed copy decodes to the same bits as :func:`tallow_quant_int4.layout.dequantize`: both
compute ``scale * (code - zero)`` in float32. It keeps the layout's column order; act-order
weights still read their input permuted.
"""

from __future__ import annotations

import torch

from tallow.kernels import PackedGemmWeight, packed_gemm, packed_weight, triton_enabled

from .layout import IntWeight, unpack_codes
from .reference import permuted_input

#: the activations' dtypes the tensor-core kernel multiplies
DTYPES = (torch.float16, torch.bfloat16)


def to_packed(w: IntWeight) -> PackedGemmWeight:
    """``w`` in the packed GEMM's layout (4-bit codes as ``u4``, 8-bit as ``u8``)."""
    codes = unpack_codes(w.codes, w.bits)
    return packed_weight(
        "u4" if w.bits == 4 else "u8",
        codes,
        w.scales,
        group=w.group,
        zeros=w.zeros,
        zero_point=0.0 if w.zeros is not None else w.zero_point,
    )


def applies(x: torch.Tensor, parts: list) -> bool:
    """Whether the tensor-core path takes ``x`` times ``parts``: Triton runs for x, x is 16-bit
    and every part is an :class:`IntWeight` (dense layers keep tallow's dense linear)."""
    return triton_enabled(x) and x.dtype in DTYPES and all(isinstance(p, IntWeight) for p in parts)


def linear(
    x: torch.Tensor,
    parts: list[IntWeight],
    packed: list[PackedGemmWeight],
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """``x [M, K] @ W^T (+ bias)``, ``W`` the parts stacked along the rows, each multiplied
    through its packed copy."""
    if all(p.perm is None for p in parts):
        return packed_gemm(x, packed, bias)
    outs = []
    start = 0
    for p, q in zip(parts, packed):
        part_bias = None if bias is None else bias[start : start + p.rows]
        outs.append(packed_gemm(permuted_input(x, p), q, part_bias))
        start += p.rows
    return torch.cat(outs, dim=-1)
