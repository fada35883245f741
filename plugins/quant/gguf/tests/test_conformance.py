"""The gguf scheme against tallow's quant-scheme conformance suite: random GGML blocks of
legacy, k-quant and non-linear types through its LinearMethod, against the gguf format's own
dequantizer."""

from __future__ import annotations

from typing import Any

import torch

from quant_blocks import random_blocks
from tallow.layers import QuantizedWeight
from tallow.plugin.testing import QuantSchemeConformance
from tallow_quant_gguf.qtypes import QUANT_TYPES

TYPES = ("Q4_0", "Q8_0", "Q4_K", "Q6_K", "IQ4_NL")


class TestGGUFSchemeConformance(QuantSchemeConformance):
    distribution = "tallow-quant-gguf"
    component = "gguf"
    light_modules = ("torch", "triton")

    def quantized_weights(self, rows: int, cols: int) -> list[Any]:
        from tallow_format_gguf.dequant import dequantize_blocks

        out = []
        for i, qtype in enumerate(TYPES):
            blocks = random_blocks(
                qtype, rows, cols // QUANT_TYPES[qtype].block, seed=i, extremes=False
            )
            out.append(
                QuantizedWeight(
                    "gguf", qtype, (rows, cols), torch.from_numpy(blocks), dequantize_blocks
                )
            )
        return out
