"""The tensor-core path (:mod:`tallow_quant_fp4.tensor_core`) against the plugin's decoding and
the float32 product, at small shapes. Not collected on its own: ``test_tensor_core.py`` runs it
with ``TRITON_INTERPRET=1``; on a CUDA machine ``python -m pytest tensor_core_cases.py`` runs it
on the GPU."""

from __future__ import annotations

import pytest
import torch

from kernel_cases import DEVICE, weight
from tallow.kernels import (
    dequantize_packed,
    packed_gemm,
    packed_gemm_config,
    packed_gemm_tolerance,
)
from tallow_quant_fp4.layout import dequantize
from tallow_quant_fp4.tensor_core import to_packed


@pytest.mark.parametrize("kind", ["mxfp4", "nvfp4"])
def test_kernel_decoding_is_the_layouts_bits(kind):
    w = weight(kind, 24, 256, seed=3)
    assert torch.equal(dequantize_packed(to_packed(w)), dequantize(w))


@pytest.mark.parametrize("m", [1, 7, 16, 256])
@pytest.mark.parametrize("kind", ["mxfp4", "nvfp4"])
def test_product_within_rounding(kind, m):
    w = weight(kind, 40, 160 if m == 7 else 256, seed=m)
    x = torch.randn(m, w.cols, generator=torch.Generator().manual_seed(m)).to(
        DEVICE, torch.bfloat16
    )
    y = packed_gemm(x, to_packed(w))
    dense = dequantize(w)
    want = x.float() @ dense.T
    splits = packed_gemm_config(m, w.rows, w.cols, "e2m1").split_k
    assert bool(((y.float() - want).abs() <= packed_gemm_tolerance(x, dense, splits)).all())
