"""Packed-weight GEMM: ``y [M, N] = x [M, K] @ dequant(W) [N, K]^T`` on tensor cores, the
weight read packed and dequantized in registers (:mod:`tallow.kernels._packed_gemm_triton`).

One layout per code width, made once at load from a format's own tensors
(:func:`packed_weight`; the quantization plugins hold the conversions from their formats), a
:class:`PackedGemmWeight`. Every element decodes as::

    w[n, k] = scale[k // group, n // scale_cols] * (code[k, n] - zero[k // group, n])
              - min[k // group, n]

computed in float32 (``code - zero`` is an exact small integer; the product is exact whenever
the scale has at most 20 significant bits, which holds for every format converted here, so a
fused multiply-add gives the same bits), so a format whose own decoding is that arithmetic
decodes to the same bits. The stored tensors are *K-major* (index ``[k, n]``): a tile of
``BLOCK_K x BLOCK_N`` weights is ``BLOCK_K`` coalesced rows, the orientation ``tl.dot``'s second
operand takes without a transpose.

=========  ==========================  ============================================
``kind``   ``codes``                   meaning
=========  ==========================  ============================================
``u4``     int32 ``[K / 8, N]``        8 unsigned 4-bit codes per word along K: the
                                       code of row ``k`` is bits ``4 (k % 8)`` of
                                       word ``k // 8`` (a ``[K/8, 8, N]`` unpack
                                       that reshapes to ``[K, N]`` in order)
``u8``     uint8 ``[K, N]``            unsigned 8-bit codes
``fp8``    float8 e4m3 ``[K, N]``      the weight's e4m3 values (zero 0)
``e2m1``   int32 ``[K / 8, N]``        FP4 e2m1 codes packed as ``u4``, decoded to
                                       their values ``±{0, .5, 1, 1.5, 2, 3, 4, 6}``
                                       (zero 0)
=========  ==========================  ============================================

``scales``: float16, bfloat16 or float32 ``[ceil(K / group), ceil(N / scale_cols)]`` (kept in
the format's type, float32 where a product of two stored fields is only exact in it);
``zeros``: uint8 ``[K / group, N]`` or None (then the constant ``zero_point``); ``mins``:
float32/float16 ``[K / group, N]`` or None.

A product of ``M <= 16`` rows splits K over ``split_k`` programs per output tile (each writes
float32 partial sums, added in a second pass: deterministic), so that a decode step still
spreads the weight's bytes over every SM; larger products tile M as a plain GEMM. Tiles come
from :func:`packed_gemm_config` (a table keyed by M bucket, N and K, :data:`TUNED_CONFIGS`, over
a default rule) or are passed explicitly.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from ._dispatch import interpreting, triton_enabled
from .packed_layout import (  # noqa: F401  (the module's public names)
    KINDS,
    SPLIT_K_MAX_ROWS,
    TARGET_PROGRAMS,
    TUNED_CONFIGS,
    PackedGemmConfig,
    PackedGemmWeight,
    check_config,
    codes_of,
    dequantize_packed_ref,
    m_bucket,
    pack_u4,
    packed_gemm_config,
    packed_weight,
    unpack_u4,
)


def packed_gemm_ref(
    x: torch.Tensor, w: PackedGemmWeight, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x [M, K] @ W^T (+ bias)`` in float32 on the exactly decoded weight, in x's dtype."""
    y = F.linear(
        x.to(torch.float32),
        dequantize_packed_ref(w),
        None if bias is None else bias.to(torch.float32),
    )
    return y.to(x.dtype)


def packed_gemm(
    x: torch.Tensor,
    w: PackedGemmWeight | Sequence[PackedGemmWeight],
    bias: torch.Tensor | None = None,
    *,
    config: PackedGemmConfig | None = None,
) -> torch.Tensor:
    """``x [..., K] @ W^T (+ bias)`` → ``[..., N]`` in x's dtype: the Triton kernel where
    Triton runs (x float16 or bfloat16), :func:`packed_gemm_ref` elsewhere. ``w`` may be a
    list of weights of one K, stacked along the rows (the partitions of a merged layer: one
    launch each, ``config`` for all of them)."""
    parts = [w] if isinstance(w, PackedGemmWeight) else list(w)
    cols = parts[0].cols
    if x.shape[-1] != cols or any(p.cols != cols for p in parts):
        raise ValueError(
            f"packed GEMM: x has {x.shape[-1]} input features, the weight "
            f"[{sum(p.rows for p in parts)}, {cols}] expects {cols}"
            + ("" if all(p.cols == cols for p in parts) else " (and its parts differ in K)")
        )
    lead = x.shape[:-1]
    x2 = x.reshape(-1, cols)
    outs = []
    start = 0
    for p in parts:
        part_bias = None if bias is None else bias[start : start + p.rows]
        start += p.rows
        if triton_enabled(x2) and x2.dtype in (torch.float16, torch.bfloat16):
            from ._packed_gemm_triton import packed_gemm_triton

            outs.append(packed_gemm_triton(x2, p, part_bias, config=config))
        else:
            outs.append(packed_gemm_ref(x2, p, part_bias))
    y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
    return y.view(*lead, start)


#: row counts :func:`packed_gemm_warm_up` runs: one per M bucket of the tile table, and
#: Triton's specialisations of one row and of multiples of 16
WARM_ROWS = (1, 2, 16, 17, 64, 128, 256)


def packed_gemm_warm_up(
    w: PackedGemmWeight | Sequence[PackedGemmWeight], dtype: torch.dtype
) -> None:
    """Compile, before serving (and before any CUDA-graph capture), the kernel variants the
    weights' products take at every row count (each of :data:`WARM_ROWS`, on zeros), where
    Triton runs them."""
    parts = [w] if isinstance(w, PackedGemmWeight) else list(w)
    if dtype not in (torch.float16, torch.bfloat16):
        return
    for p in parts:
        if triton_enabled(p.codes):
            for m in WARM_ROWS:
                packed_gemm(torch.zeros(m, p.cols, dtype=dtype, device=p.device), p)


def dequantize_packed(w: PackedGemmWeight) -> torch.Tensor:
    """The weight as float32 ``[N, K]``: the kernels' own decoding where Triton runs (the
    bits the GEMM multiplies), the torch reference elsewhere."""
    if triton_enabled(w.codes):
        from ._packed_gemm_triton import dequantize_packed_triton

        return dequantize_packed_triton(w)
    return dequantize_packed_ref(w)


def packed_gemm_tolerance(x: torch.Tensor, weight: torch.Tensor, splits: int = 1) -> torch.Tensor:
    """The bound ``[M, N]`` on ``|packed_gemm(x, W) - x @ W^T|`` against the float32 product
    of x (16-bit) and the exactly decoded ``weight`` (float32 ``[N, K]``).

    The kernel rounds each weight once to x's dtype (relative error at most ``u``, the unit
    roundoff: 2^-8 for bfloat16, 2^-11 for float16), multiplies exactly into float32, adds
    ``K`` products and up to ``splits`` partial sums in float32 (at most ``gamma = (K +
    splits) * 2^-24`` relative to ``sum |x| |w|``), and rounds the result to x's dtype (``u``
    of its magnitude). The float32 reference adds its own ``K * 2^-24``. So
    ``|err| <= u |y| + (1 + u) (u + gamma + K 2^-24) sum_k |x_k| |w_k|``, here with a 1 %
    margin on the second term. Triton's CPU interpreter converts float32 to bfloat16 by
    truncation, not to nearest: there (``TRITON_INTERPRET=1``, bfloat16 x) ``u`` is the whole
    machine epsilon, 2^-7."""
    eps = torch.finfo(x.dtype).eps
    u = eps if interpreting() and x.dtype == torch.bfloat16 else eps / 2
    k = weight.shape[1]
    gamma = (2 * k + splits) * 2.0**-24
    magnitude = x.abs().to(torch.float32) @ weight.abs().T
    y = x.to(torch.float32) @ weight.T
    return u * y.abs() + 1.01 * (1 + u) * (u + gamma) * magnitude
