"""Triton kernels of tallow-quant-int4, each with its torch reference in ``reference.py``."""
