"""tallow-quant-int4: GPTQ, AWQ, Marlin and compressed-tensors integer weights, and
``model.isq: int4``, kept as 4- or 8-bit codes and multiplied by Triton kernels."""

__version__ = "0.1.0"
