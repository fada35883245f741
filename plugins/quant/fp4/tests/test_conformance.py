"""The fp4 scheme against tallow's quant-scheme conformance suite: a layer of each FP4
checkpoint format through the scheme's LinearMethod computes what the float weight its
tensors stand for computes."""

from __future__ import annotations

from fp4_checkpoints import CONFIGS, dense_of, random_fp4
from tallow.plugin.testing import QuantizedLayer, QuantSchemeConformance


class TestFP4SchemeConformance(QuantSchemeConformance):
    distribution = "tallow-quant-fp4"
    component = "fp4"
    light_modules = ("torch", "triton")

    def quantized_layers(self, rows: int, cols: int) -> list[QuantizedLayer]:
        out = []
        for kind in ("mxfp4", "ct-mxfp4", "nvfp4"):
            t = random_fp4(rows, cols, kind, seed=len(out))
            out.append(QuantizedLayer(kind, t, dense_of(t), {"quantization_config": CONFIGS[kind]}))
        return out
