"""Registration of the quant scheme ``fp8`` (imports neither torch nor triton)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_quant_schemes(registry) -> None:
    registry.register("fp8", "tallow_quant_fp8.scheme:Fp8QuantScheme", priority=100)
