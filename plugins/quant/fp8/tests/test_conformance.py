"""The fp8 scheme against tallow's quant-scheme conformance suite: e4m3 weights with one scale
per row and with 128 x 128 block scales (as ``fp8`` QuantizedWeights) through its
LinearMethod, against their own dequantization."""

from __future__ import annotations

from typing import Any

import torch

from tallow.plugin.testing import QuantSchemeConformance
from tallow_quant_fp8.weights import BLOCK, Fp8Weight, as_quantized, quantize_rows


class TestFp8SchemeConformance(QuantSchemeConformance):
    distribution = "tallow-quant-fp8"
    component = "fp8"
    light_modules = ("torch", "triton")
    rows = BLOCK  # merged block-wise partitions hold whole 128-row blocks

    def quantized_weights(self, rows: int, cols: int) -> list[Any]:
        g = torch.Generator().manual_seed(rows * cols)
        row = quantize_rows(torch.randn(rows, cols, generator=g) * 0.05)
        blocks = torch.rand(-(-rows // BLOCK), -(-cols // BLOCK), generator=g) * 1e-3 + 1e-4
        return [as_quantized(row), as_quantized(Fp8Weight(row.data, blocks, "block"))]
