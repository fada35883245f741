"""Compute kernels of tallow. Each Triton kernel has a plain-torch reference beside it; the
references are what the CPU path runs.

Entry points (each runs its Triton kernel on CUDA tensors and its ``*_ref`` reference
elsewhere; Triton itself is imported only when a kernel first runs on a GPU):

* ``store_kv(kv_cache, k, v, slot_mapping)``: write K/V into the paged cache.
* ``rms_norm(x, weight, eps, residual=None, gemma_style=False)``: RMSNorm, optionally with the
  residual add fused (returns ``(out, new_residual)``).
* ``rotary_embedding(positions, q, k, cos_sin_cache, head_size, is_neox=True, inplace=True)``.
* ``silu_and_mul(x)``, ``gelu_tanh_and_mul(x)``: gated MLP activations.
* ``argmax_rows(x)``: greedy decoding's argmax per row (two-stage on CUDA).
* ``tallow.kernels.linear.linear(x, weight, bias=None)``: dense linear layer; a Triton GEMV
  for one row (not re-exported here: the name would hide the submodule).
* ``tallow.kernels.sampling``: logit edits, Gumbel noise and the fused Gumbel argmax used by
  the sampler.
* ``tallow.kernels.token_bitmask``: ``apply_token_bitmask(logits, bitmask, rows)``, the
  structured-output mask (packed int32 words of allowed tokens) applied to a step's logits.
* ``triton_enabled(tensor)``: whether an entry point runs its Triton kernel for ``tensor``
  (for plugins whose kernels follow the same rule); ``interpreting()``: whether those kernels
  run in Triton's CPU interpreter (``TRITON_INTERPRET=1``), which cannot run inline PTX.
"""

from ._dispatch import interpreting, triton_enabled
from .activation import gelu_tanh_and_mul, gelu_tanh_and_mul_ref, silu_and_mul, silu_and_mul_ref
from .argmax import argmax_rows, argmax_rows_ref
from .attention_ref import store_kv_ref
from .kv_store import store_kv
from .norm import rms_norm, rms_norm_ref
from .rotary import rotary_embedding, rotary_embedding_ref

__all__ = [
    "argmax_rows", "argmax_rows_ref", "gelu_tanh_and_mul", "gelu_tanh_and_mul_ref", "interpreting",
    "rms_norm", "rms_norm_ref", "rotary_embedding", "rotary_embedding_ref", "silu_and_mul",
    "silu_and_mul_ref", "store_kv", "store_kv_ref", "triton_enabled",
]
