"""tallow-quant-fp4: MXFP4 and NVFP4 weights (and ``model.isq: mxfp4``) decoded by Triton
kernels for dense linear layers."""

__version__ = "0.1.0"
