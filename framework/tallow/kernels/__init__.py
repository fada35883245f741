"""Compute kernels of tallow. Each Triton kernel has a plain-torch reference beside it; the
references are what the CPU path runs.

A plugin imports what it uses from this package, and only the names of :data:`__all__` (the
boundary test checks it); the submodules are the core's own layout and may change. Importing
the package imports torch but not Triton: the names marked *(Triton)* below are resolved when
first taken, and an entry point imports its Triton kernel only when it first runs on a GPU.

Entry points (each runs its Triton kernel on CUDA tensors and its ``*_ref`` reference
elsewhere):

* ``rms_norm(x, weight, eps, residual=None, gemma_style=False)``: RMSNorm, optionally with the
  residual add fused (returns ``(out, new_residual)``).
* ``rotary_embedding(positions, q, k, cos_sin_cache, head_size, is_neox=True, inplace=True)``.
* ``silu_and_mul(x)``, ``gelu_tanh_and_mul(x)``: gated MLP activations.
* ``argmax_rows(x)``: greedy decoding's argmax per row (two-stage on CUDA).
* ``dense_linear(x, weight, bias=None)``: dense linear layer, a Triton GEMV for one row;
  ``gated_linear(x, weight, bias=None, *, kind)``: the same product of the gated activation
  of ``x`` in one launch.
* ``gemv_triton(x, weight, bias=None, *, scale=None, gate=None)`` *(Triton)*: the GEMV of up to
  ``GEMV_MAX_ROWS`` (16) rows on CUDA tensors, for float weights and for float8 e4m3 weights
  with float32 scales per output row (``[N]``) or per 128 x 128 block; quantized-weight
  plugins call it for their decode products, with ``gemv_config(m, n, k, weight_dtype)`` its
  tile choice.
* ``packed_gemm(x, w, bias=None, *, config=None)``: ``x @ dequant(W)^T`` on tensor cores with
  the weight read packed (4-bit, 8-bit or e4m3 codes with scales per group) and decoded in
  registers, split-K for a few rows (``w`` one weight or a list stacked along the rows;
  ``packed_gemm_warm_up(w, dtype)`` compiles its variants); ``PackedGemmWeight`` its layout, made by
  ``packed_weight(kind, codes, scales, group=..., zeros=..., zero_point=..., mins=...)`` from a
  format's tensors; ``dequantize_packed`` the kernels' decoding written out (float32), with
  ``dequantize_packed_ref`` and ``packed_gemm_ref`` the references (``packed_gemm_tolerance``: the
  bound of the product's rounding against them); ``PackedGemmConfig`` and
  ``packed_gemm_config(m, n, k, kind)`` its tiles (``PACKED_GEMM_TUNED``: the tuned table).
* ``rms_norm_ref``, ``rotary_embedding_ref``, ``silu_and_mul_ref``, ``gelu_tanh_and_mul_ref``,
  ``argmax_rows_ref``, ``store_cast_kv_ref``: the torch references, for plugins' tests.
* ``fused_moe(x, w13, w2, topk_weights, topk_ids, ...)``: a mixture-of-experts MLP over stacked
  expert weights (``moe_align``: token → expert alignment; grouped GEMMs with the activation and
  the routing weight fused, a GEMV path for a few tokens; tiles from
  :mod:`tallow.kernels.moe_config`, not re-exported: the name would hide the submodule), with
  ``fused_moe_ref`` / ``moe_align_ref`` its references and ``MoEConfig`` its tiles
  (``default_moe_config``: the untuned choice of path and tiles by token count, which
  quantized-expert kernels of plugins start from). A plugin's own MoE kernels share the
  rest with the core's: ``check_moe_routing`` (host-side checks), ``MOE_ACTIVATION_CODES`` and,
  *(Triton)*, ``moe_activate``, ``moe_epilogue``, ``moe_block_ids``, ``moe_block_rows``,
  ``moe_store_rows`` (:mod:`tallow.kernels.moe_tiles`).
* ``triton_enabled(tensor)``: whether an entry point runs its Triton kernel for ``tensor``
  (for plugins whose kernels follow the same rule); ``interpreting()``: whether those kernels
  run in Triton's CPU interpreter (``TRITON_INTERPRET=1``), which cannot run inline PTX.

Linear attention with a recurrent state per sequence (Gated DeltaNet; state slots of a
:class:`tallow.layers.RecurrentStateSpec` group, updated in place):

* ``chunk_gated_delta_rule(q, k, v, g, beta, state, slots, query_start_loc, ...)``: the gated
  delta rule over a step's flat sequences (prefill and chunks); ``gated_delta_step(q, k, v, a,
  b, A_log, dt_bias, state, slots)``: one token per sequence with the gating fused (decode);
  ``gdn_gating``, ``l2_normalize``: the gates and the q/k normalisation of Qwen3-Next;
* ``causal_conv1d(x, weight, bias, conv_state, slots, query_start_loc, ...)`` and
  ``causal_conv1d_update(x, weight, bias, conv_state, slots)``: the short causal depthwise
  convolution before it; ``gated_rms_norm(x, z, weight, eps)``: the gated RMSNorm after it;
* ``chunk_gated_delta_rule_ref``, ``recurrent_gated_delta_rule_ref`` (one sequence, token by
  token), ``gated_delta_step_ref``, ``causal_conv1d_ref``, ``causal_conv1d_update_ref``,
  ``gated_rms_norm_ref``: the references.

The paged KV cache (:mod:`tallow.kernels.kv_cache` owns layouts, allocation, block copy,
capacity and the dtype rules of 8-bit caches):

* ``LayerKVCache``: one attention layer's cache tensors as its KV codec lays them out;
  ``allocate_layer(codec, *, num_kv_heads, head_dim, block_size, num_blocks, model_dtype,
  device)`` makes one;
* ``to_cache_dtype``, ``cache_saturation``, ``float8_reasons``: the 8-bit caches' dtype rules
  (rounding, the largest finite value, whether a device stores float8); ``slots_to_blocks``:
  the cache blocks a slot mapping touches;
* ``CastKVCodec``: the base of the codecs that store K/V cast to a dtype (the core's ``auto``;
  tallow-kvcache-fp8 derives its fp8 codec from it); ``store_cast_kv(k_cache, v_cache, k, v,
  slot_mapping)`` writes K/V into such a cache for backends whose kernels only read it;
* ``attention_ref`` and ``paged_attention_ref``: the attention reference, dense and over a
  paged cache read through its codec's ``decode``, that attention backends are tested against.

The latent cache of multi-head latent attention (MLA; :mod:`tallow.kernels.mla_ref`):

* ``store_latent_ref(cache, latent, slot_mapping)``: writes a step's latent rows into a
  ``[blocks, block_size, W]`` cache; ``mla_attention_ref(q_nope, q_pe, cache, *, w_uk, w_uv,
  ...)``: MLA over the paged latent cache, expanded K/V (prefill) or with the up-projections
  absorbed (decode), ``mla_expanded_ref`` / ``mla_absorbed_ref`` the two forms for one
  sequence; ``absorb_queries(q_nope, w_uk)``: the latent queries of the absorbed form.

For plugins' own Triton kernels:

* ``step_jit(values=..., pointers=...)`` *(Triton)*: ``triton.jit`` without the
  specializations that would compile a new variant when a step-dependent argument changes;
* ``pdl_enabled(where)``, ``wait_prior()``, ``allow_next()`` *(Triton)*: Programmatic Dependent
  Launch, the rules of :mod:`tallow.kernels.pdl`; for tests ``set_pdl``,
  ``unsupported_reason``, ``off_then_on`` and ``compiled_with_pdl``;
* ``gated_value``, ``load_activations``, ``ACTIVATION_KINDS`` *(Triton)*: the gated
  activation inside a kernel, by kind number;
* ``QUAD_COLUMNS``, ``pack_quads``, ``unpack_quads``: the quad layout of packed 4- and 8-bit
  codes; ``bit_constants``, ``byte_to_bits_15``, ``bits_as_float`` *(Triton)*: codes to float
  bits in a kernel; ``quad_launch_config``, ``quad_tile_mask`` *(Triton)*: the tiles and warps
  of a small-batch kernel over quads;
* ``cuda_index``, ``capability``, ``cuda_device_reasons``: which GPU a device string names and
  whether it has a compute capability;
* ``compile_for_gpu``, ``resource_usage``, ``sass_loops``, ``sass_opcode``, ``pdl_order``:
  building a kernel for a GPU on a machine without one, for tests (registers, vector loads,
  tensor-core instructions, where PDL's wait falls).

The sampler's kernels (:mod:`tallow.kernels.sampling`) and the structured-output masks
(:mod:`tallow.kernels.token_bitmask`: ``apply_token_bitmask`` and ``masked_argmax``) serve the
engine and are not part of the plugin surface.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._dispatch import interpreting, triton_enabled
from .activation import gelu_tanh_and_mul, gelu_tanh_and_mul_ref, silu_and_mul, silu_and_mul_ref
from .argmax import argmax_rows, argmax_rows_ref
from .attention_ref import attention_ref, paged_attention_ref
from .causal_conv import (
    causal_conv1d,
    causal_conv1d_ref,
    causal_conv1d_update,
    causal_conv1d_update_ref,
)
from .cuda_device import capability, cuda_device_reasons, cuda_index
from .kv_cache import (
    LayerKVCache,
    allocate_layer,
    cache_saturation,
    float8_reasons,
    slots_to_blocks,
    to_cache_dtype,
)
from .kv_cast import CastKVCodec
from .kv_store import store_cast_kv, store_cast_kv_ref
from .gated_delta import (
    chunk_gated_delta_rule,
    chunk_gated_delta_rule_ref,
    gated_delta_step,
    gated_delta_step_ref,
    gdn_gating,
    l2_normalize,
    recurrent_gated_delta_rule_ref,
)
from .gated_norm import gated_rms_norm, gated_rms_norm_ref
from .mla_ref import (
    absorb_queries,
    mla_absorbed_ref,
    mla_attention_ref,
    mla_expanded_ref,
    store_latent_ref,
)
from .linear import gated_linear
from .linear import linear as dense_linear
from .moe import (
    MOE_ACTIVATION_CODES,
    MoEConfig,
    check_moe_routing,
    fused_moe,
    fused_moe_ref,
    moe_align,
    moe_align_ref,
)
from .moe_config import default_moe_config
from .norm import rms_norm, rms_norm_ref
from .packed_gemm import TUNED_CONFIGS as PACKED_GEMM_TUNED
from .packed_gemm import (
    PackedGemmConfig,
    PackedGemmWeight,
    dequantize_packed,
    dequantize_packed_ref,
    packed_gemm,
    packed_gemm_config,
    packed_gemm_ref,
    packed_gemm_tolerance,
    packed_gemm_warm_up,
    packed_weight,
)
from .quads import QUAD_COLUMNS, pack_quads, unpack_quads
from .rotary import rotary_embedding, rotary_embedding_ref

#: the public names whose modules import Triton (or, for the offline compiler, are only for
#: tests): public name -> (submodule, name there), imported when first taken
_LAZY: dict[str, tuple[str, str]] = {
    "ACTIVATION_KINDS": ("_activation_triton", "KINDS"),
    "gated_value": ("_activation_triton", "gated_value"),
    "load_activations": ("_activation_triton", "load_activations"),
    "bit_constants": ("code_bits", "bit_constants"),
    "bits_as_float": ("code_bits", "bits_as_float"),
    "byte_to_bits_15": ("code_bits", "byte_to_bits_15"),
    "GEMV_MAX_ROWS": ("_gemv_triton", "MAX_ROWS"),
    "gemv_config": ("_gemv_triton", "gemv_config"),
    "gemv_triton": ("_gemv_triton", "gemv_triton"),
    "step_jit": ("jit", "step_jit"),
    "allow_next": ("pdl", "allow_next"),
    "wait_prior": ("pdl", "wait_prior"),
    "pdl_enabled": ("pdl", "pdl_enabled"),
    "set_pdl": ("pdl", "set_pdl"),
    "unsupported_reason": ("pdl", "unsupported_reason"),
    "off_then_on": ("pdl", "off_then_on"),
    "compiled_with_pdl": ("pdl", "compiled_with_pdl"),
    "quad_launch_config": ("quad_gemv", "launch_config"),
    "quad_tile_mask": ("quad_gemv", "tile_mask"),
    "compile_for_gpu": ("_offline", "compile_for_gpu"),
    "resource_usage": ("_offline", "resource_usage"),
    "sass_loops": ("_offline", "sass_loops"),
    "sass_opcode": ("_offline", "opcode"),
    "pdl_order": ("_offline", "pdl_order"),
    "moe_activate": ("moe_tiles", "moe_activate"),
    "moe_epilogue": ("moe_tiles", "moe_epilogue"),
    "moe_block_ids": ("moe_tiles", "moe_block_ids"),
    "moe_block_rows": ("moe_tiles", "moe_block_rows"),
    "moe_store_rows": ("moe_tiles", "moe_store_rows"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(f"{__name__}.{module}"), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    # entry points
    "argmax_rows",
    "argmax_rows_ref",
    "dense_linear",
    "gated_linear",
    "gelu_tanh_and_mul",
    "gelu_tanh_and_mul_ref",
    "rms_norm",
    "rms_norm_ref",
    "rotary_embedding",
    "rotary_embedding_ref",
    "silu_and_mul",
    "silu_and_mul_ref",
    "interpreting",
    "triton_enabled",
    "GEMV_MAX_ROWS",
    "gemv_config",
    "gemv_triton",
    # tensor-core GEMM of packed weights
    "PACKED_GEMM_TUNED",
    "PackedGemmConfig",
    "PackedGemmWeight",
    "dequantize_packed",
    "dequantize_packed_ref",
    "packed_gemm",
    "packed_gemm_config",
    "packed_gemm_ref",
    "packed_gemm_tolerance",
    "packed_gemm_warm_up",
    "packed_weight",
    # the paged KV cache
    "CastKVCodec",
    "LayerKVCache",
    "allocate_layer",
    "attention_ref",
    "cache_saturation",
    "float8_reasons",
    "paged_attention_ref",
    "slots_to_blocks",
    "store_cast_kv",
    "store_cast_kv_ref",
    "to_cache_dtype",
    # the latent (MLA) cache
    "absorb_queries",
    "mla_absorbed_ref",
    "mla_attention_ref",
    "mla_expanded_ref",
    "store_latent_ref",
    # plugins' own kernels
    "ACTIVATION_KINDS",
    "QUAD_COLUMNS",
    "allow_next",
    "bit_constants",
    "bits_as_float",
    "byte_to_bits_15",
    "capability",
    "compiled_with_pdl",
    "compile_for_gpu",
    "cuda_device_reasons",
    "cuda_index",
    "gated_value",
    "load_activations",
    "off_then_on",
    "pack_quads",
    "pdl_enabled",
    "pdl_order",
    "quad_launch_config",
    "quad_tile_mask",
    "resource_usage",
    "sass_loops",
    "sass_opcode",
    "set_pdl",
    "step_jit",
    "unpack_quads",
    "unsupported_reason",
    "wait_prior",
    # mixture of experts
    "MoEConfig",
    "default_moe_config",
    "fused_moe",
    "fused_moe_ref",
    "moe_align",
    "moe_align_ref",
    # the parts a quantized-experts plugin's MoE kernels share with the core's
    "MOE_ACTIVATION_CODES",
    "check_moe_routing",
    "moe_activate",
    "moe_block_ids",
    "moe_block_rows",
    "moe_epilogue",
    "moe_store_rows",
    # linear attention with a recurrent state per sequence (Gated DeltaNet)
    "causal_conv1d",
    "causal_conv1d_ref",
    "causal_conv1d_update",
    "causal_conv1d_update_ref",
    "chunk_gated_delta_rule",
    "chunk_gated_delta_rule_ref",
    "gated_delta_step",
    "gated_delta_step_ref",
    "gdn_gating",
    "gated_rms_norm",
    "gated_rms_norm_ref",
    "l2_normalize",
    "recurrent_gated_delta_rule_ref",
]
