"""An oracle for KV codecs: transformers whose attention sees K and V as a tallow cache stores
and reads them back (the codec's reference encode and decode, with the per-layer tensors the
engine calibrated)."""

from __future__ import annotations

import torch

from tallow.kernels import kv_cache


def round_trip(cache: kv_cache.LayerKVCache, x: torch.Tensor, name: str) -> torch.Tensor:
    """Keys or values [T, Hkv, D] as ``cache``'s codec stores and reads them back (a scratch
    cache with the same per-layer tensors: rotation, offsets, smoothing)."""
    t = x.shape[0]
    scratch = kv_cache.allocate_layer(
        cache.codec,
        num_kv_heads=cache.num_kv_heads,
        head_dim=cache.head_dim,
        block_size=cache.block_size,
        num_blocks=-(-t // cache.block_size),
        model_dtype=cache.model_dtype,
        layer=cache.layer,
    )
    for spec in cache.layout:
        if not spec.per_block:
            scratch[spec.name].copy_(cache[spec.name])
    other = torch.zeros_like(x)
    k, v = (x, other) if name == "k" else (other, x)
    cache.codec.encode(scratch, k, v, torch.arange(t))
    got_k, got_v = cache.codec.decode(scratch, torch.arange(scratch.num_blocks))
    return (got_k if name == "k" else got_v)[:t]


def hf_model_through(path, caches: list[kv_cache.LayerKVCache], tag: str):
    """transformers' model of ``path`` whose attention sees K and V as ``caches`` (one per
    layer, from tallow's engine) store them."""
    from transformers import AttentionInterface, AutoModelForCausalLM
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def codec_attention(module, query, key, value, attention_mask, **kwargs):
        cache = caches[module.layer_idx]
        # [B=1, Hkv, T, D] <-> [T, Hkv, D]
        key = round_trip(cache, key[0].transpose(0, 1).float(), "k").transpose(0, 1)[None]
        value = round_trip(cache, value[0].transpose(0, 1).float(), "v").transpose(0, 1)[None]
        return sdpa_attention_forward(
            module, query, key.to(query.dtype), value.to(query.dtype), attention_mask, **kwargs
        )

    name = f"sdpa-through-{tag}"
    AttentionInterface.register(name, codec_attention)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation=name)
