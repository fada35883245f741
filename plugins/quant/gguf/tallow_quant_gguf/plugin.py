"""Registration of the quant scheme ``gguf`` (imports neither torch nor triton)."""

from __future__ import annotations

from tallow.plugin import hookimpl


@hookimpl
def tallow_register_quant_schemes(registry) -> None:
    registry.register("gguf", "tallow_quant_gguf.scheme:GGUFQuantScheme", priority=100)
