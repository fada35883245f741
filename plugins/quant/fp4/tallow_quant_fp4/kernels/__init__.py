"""Triton kernels of tallow-quant-fp4; their torch references are in ``layout.py``."""
