"""Registration of the quant scheme ``fp4`` (imports neither torch nor triton)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_quant_schemes(registry) -> None:
    registry.register(
        "fp4",
        "tallow_quant_fp4.scheme:FP4QuantScheme",
        priority=80,
        quant_methods=("mxfp4", "compressed-tensors"),
    )
