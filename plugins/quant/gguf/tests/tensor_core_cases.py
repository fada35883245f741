"""The tensor-core path (:mod:`tallow_quant_gguf.tensor_core`) against ``gguf``'s own
dequantization and the float32 product, at small shapes. Not collected on its own:
``test_tensor_core.py`` runs it with ``TRITON_INTERPRET=1``; on a CUDA machine
``python -m pytest tensor_core_cases.py`` runs it on the GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernel_cases import DEVICE, same_bits, weight
from tallow.kernels import dequantize_packed, packed_gemm, packed_gemm_config
from tallow.kernels import packed_gemm_tolerance
from tallow_quant_gguf import tensor_core

TYPES = sorted(tensor_core.TYPES)


@pytest.mark.parametrize("qtype", TYPES)
def test_kernel_decoding_is_ggufs_bits(qtype):
    """Every field value, extremes included (zeros, subnormals, infinities, NaN scales)."""
    import gguf

    blocks, packed = weight(qtype, 19, 512, "tensor_core", extremes=True)
    with np.errstate(all="ignore"):
        expected = torch.from_numpy(np.ascontiguousarray(gguf.quants.dequantize(
            blocks, gguf.GGMLQuantizationType[qtype]), dtype=np.float32))
    same_bits(dequantize_packed(tensor_core.to_packed(packed)), expected, qtype)


@pytest.mark.parametrize("m", [1, 7, 16, 256])
@pytest.mark.parametrize("qtype", TYPES)
def test_product_within_rounding(qtype, m):
    # Q4_K's 256-element blocks: K = 512 (2 blocks) and 768 (3, an odd count of K tiles)
    k = 768 if m == 7 else 512
    _, packed = weight(qtype, 40, k, "tc product", m)
    w = tensor_core.to_packed(packed)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(DEVICE, torch.bfloat16)
    y = packed_gemm(x, w)
    dense = dequantize_packed(w)
    want = x.float() @ dense.T
    splits = packed_gemm_config(m, 40, k, w.kind).split_k
    assert bool(((y.float() - want).abs() <= packed_gemm_tolerance(x, dense, splits)).all())
