"""The opt-in tensor-core path of the weight-only products (setting ``kernel: tensor_core``):
the e4m3 weight re-laid once into the packed GEMM's layout (:class:`tallow.kernels.
PackedGemmWeight`, kind ``fp8``: K-major codes, the per-row or 128 x 128 block scales as its
groups) and multiplied by :func:`tallow.kernels.packed_gemm` instead of the GEMV.

The packed copy decodes to ``float32(q) * scale``, the bits of :meth:`Fp8Weight.dequantize`.
"""

from __future__ import annotations

from tallow.kernels import PackedGemmWeight, packed_weight

from .weights import BLOCK, Fp8Weight


def to_packed(w: Fp8Weight) -> PackedGemmWeight:
    """``w`` in the packed GEMM's layout."""
    if w.block:
        return packed_weight("fp8", w.data, w.scale, group=BLOCK, scale_cols=BLOCK)
    return packed_weight("fp8", w.data, w.scale[:, None], group=w.cols)
