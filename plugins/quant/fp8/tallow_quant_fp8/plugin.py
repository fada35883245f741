"""Registration of the quant scheme ``fp8`` (imports neither torch nor triton)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_quant_schemes(registry) -> None:
    # its own name covers HF / vLLM "fp8" checkpoints; detect() picks the float8 ones among
    # compressed-tensors checkpoints
    registry.register(
        "fp8",
        "tallow_quant_fp8.scheme:Fp8QuantScheme",
        priority=100,
        quant_methods=("compressed-tensors",),
    )
