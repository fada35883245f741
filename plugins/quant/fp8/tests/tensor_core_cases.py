"""The tensor-core path of the weight-only products (:mod:`tallow_quant_fp8.tensor_core`)
against the float32 product of the dequantized weight, at small shapes. Not collected on its
own: ``test_tensor_core.py`` runs it with ``TRITON_INTERPRET=1``; on a CUDA machine
``python -m pytest tensor_core_cases.py`` runs it on the GPU."""

from __future__ import annotations

import pytest
import torch

from kernel_cases import gen, random_weight, randn
from tallow.kernels import dequantize_packed, packed_gemm_config, packed_gemm_tolerance
from tallow_quant_fp8 import ops
from tallow_quant_fp8.ops import LayerPlan
from tallow_quant_fp8.settings import Fp8Settings
from tallow_quant_fp8.tensor_core import to_packed

#: (layout, N, K): per-row scales with K not a multiple of the K tile; 128 x 128 blocks with
#: N not a multiple of 128
SHAPES = [("row", 48, 200), ("block", 200, 256)]


@pytest.mark.parametrize("layout,n,k", SHAPES)
def test_kernel_decoding_is_the_weights_bits(layout, n, k):
    w = random_weight(n, k, layout, gen("tc decode", layout))
    assert torch.equal(dequantize_packed(to_packed(w)), w.dequantize())


@pytest.mark.parametrize("m", [1, 7, 16, 256])
@pytest.mark.parametrize("layout,n,k", SHAPES)
def test_weight_only_products_within_rounding(layout, n, k, m):
    """Through ``ops.linear``: up to ``gemv_max_rows`` rows (and every row of a weights-only
    plan) take the packed GEMM."""
    g = gen("tc product", layout, m)
    w = random_weight(n, k, layout, g)
    plan = LayerPlan("none", packed=to_packed(w))
    x = randn(m, k, g=g, dtype=torch.bfloat16)
    y = ops.linear(x, w, plan, settings=Fp8Settings(kernel="tensor_core"))
    dense = w.dequantize()
    want = x.float() @ dense.T
    splits = packed_gemm_config(m, n, k, "fp8").split_k
    assert bool(((y.float() - want).abs() <= packed_gemm_tolerance(x, dense, splits)).all())
