"""Compute kernels of tallow. Each Triton kernel has a plain-torch reference beside it; the
references are what the CPU path runs."""
