"""Triton kernels of the paged-attention backend: the KV store, varlen prefill and split-K
decode. The host-side launchers live in :mod:`tallow_attention_triton.ops`."""
