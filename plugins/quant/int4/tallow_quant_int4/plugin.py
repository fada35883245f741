"""Registration of the quant scheme ``int4`` (imports neither torch nor triton)."""

from __future__ import annotations

from tallow.plugin import hookimpl

#: the checkpoint ``quantization_config.quant_method`` values the scheme reads
QUANT_METHODS = ("gptq", "gptq_marlin", "awq", "awq_marlin", "marlin", "compressed-tensors")


@hookimpl
def tallow_register_quant_schemes(registry) -> None:
    registry.register(
        "int4", "tallow_quant_int4.scheme:IntQuantScheme", priority=90, quant_methods=QUANT_METHODS
    )
