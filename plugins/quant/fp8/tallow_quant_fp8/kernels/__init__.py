"""Triton kernels of the fp8 scheme; each has its torch reference in :mod:`..reference`."""
