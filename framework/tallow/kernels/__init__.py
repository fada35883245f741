"""Compute kernels of tallow. Each Triton kernel has a plain-torch reference beside it; the
references are what the CPU path runs.

Entry points (each runs its Triton kernel on CUDA tensors and its ``*_ref`` reference
elsewhere; Triton itself is imported only when a kernel first runs on a GPU):

* ``rms_norm(x, weight, eps, residual=None, gemma_style=False)``: RMSNorm, optionally with the
  residual add fused (returns ``(out, new_residual)``).
* ``rotary_embedding(positions, q, k, cos_sin_cache, head_size, is_neox=True, inplace=True)``.
* ``silu_and_mul(x)``, ``gelu_tanh_and_mul(x)``: gated MLP activations.
* ``argmax_rows(x)``: greedy decoding's argmax per row (two-stage on CUDA).
* ``tallow.kernels.linear.linear(x, weight, bias=None)``: dense linear layer; a Triton GEMV
  for one row (not re-exported here: the name would hide the submodule).
* ``tallow.kernels.gemv_triton.gemv_triton(x, weight, bias=None, *, scale=None, gate=None)``:
  the GEMV of up to 16 rows on CUDA tensors, for float weights and for float8 e4m3 weights
  with float32 scales per output row (``[N]``) or per 128 x 128 block; quantized-weight
  plugins call it for their decode products.
* ``tallow.kernels.sampling``: logit edits, Gumbel noise and the fused Gumbel argmax used by
  the sampler.
* ``tallow.kernels.token_bitmask``: ``apply_token_bitmask(logits, bitmask, rows)``, the
  structured-output mask (packed int32 words of allowed tokens) applied to a step's logits,
  and ``masked_argmax(logits, bitmask, rows)``, greedy decoding under those masks in one pass.
* ``fused_moe(x, w13, w2, topk_weights, topk_ids, ...)``: a mixture-of-experts MLP over stacked
  expert weights (:mod:`tallow.kernels.moe`: token → expert alignment ``moe_align``, grouped
  GEMMs with the activation and the routing weight fused, a GEMV path for a few tokens; tiles
  from :mod:`tallow.kernels.moe_config`, not re-exported: the name would hide the submodule).
* ``triton_enabled(tensor)``: whether an entry point runs its Triton kernel for ``tensor``
  (for plugins whose kernels follow the same rule); ``interpreting()``: whether those kernels
  run in Triton's CPU interpreter (``TRITON_INTERPRET=1``), which cannot run inline PTX.

The paged KV cache is owned by :mod:`tallow.kernels.kv_cache` (layouts, allocation, block
copy, capacity, the dtype rules of 8-bit caches); :mod:`tallow.kernels.kv_cast` holds the
codecs that cast (``auto`` and the base of fp8); :func:`store_cast_kv` (:mod:`.kv_store`)
writes K/V into a plain cast codec's ``k``/``v`` tensors for backends whose kernels only read
the cache; :mod:`tallow.kernels.attention_ref` is the
paged-attention reference, which reads any codec's cache through the codec's ``decode``.
"""

from ._dispatch import interpreting, triton_enabled
from .activation import gelu_tanh_and_mul, gelu_tanh_and_mul_ref, silu_and_mul, silu_and_mul_ref
from .argmax import argmax_rows, argmax_rows_ref
from .kv_store import store_cast_kv, store_cast_kv_ref
from .moe import MoEConfig, fused_moe, fused_moe_ref, moe_align, moe_align_ref
from .norm import rms_norm, rms_norm_ref
from .rotary import rotary_embedding, rotary_embedding_ref

__all__ = [
    "argmax_rows", "argmax_rows_ref", "fused_moe", "fused_moe_ref", "gelu_tanh_and_mul",
    "gelu_tanh_and_mul_ref", "interpreting", "MoEConfig", "moe_align", "moe_align_ref",
    "rms_norm", "rms_norm_ref", "rotary_embedding", "rotary_embedding_ref", "silu_and_mul",
    "silu_and_mul_ref", "store_cast_kv",
    "store_cast_kv_ref", "triton_enabled",
]
