"""Triton kernels of the plugin (imported only when a kernel first runs where Triton does)."""
