"""KV codecs that cast: each K and V element stored in one storage dtype.

:class:`CastKVCodec` lays out two paged tensors per layer, ``k`` and ``v`` of
``[block_size, Hkv, D]`` each. Its encoding is a cast: values are clamped to the storage
dtype's largest finite value when it is an 8-bit float (which has no infinity), rounded to
nearest even, and widened when read (:func:`tallow.kernels.kv_cache.to_cache_dtype`).

With ``per_head_scales`` the layout adds ``k_scale`` and ``v_scale`` (float32 ``[Hkv]``, one
per layer): a head's values are stored divided by its scale and multiplied by it when read,
so that an 8-bit float's range covers a head whose values are far from 1. Scales of 1 store
exactly what an unscaled codec stores; :meth:`CastKVCodec.use_checkpoint_scales` takes them
from the checkpoint (FP8-KV checkpoints' ``self_attn.k_scale``/``v_scale``).

With ``center_keys`` the layout adds ``k_offset`` (float32 ``[Hkv, D]``, one per layer): the
mean key of each head over the engine's calibration text (:meth:`CastKVCodec.calibrate`),
subtracted from every key before the cast and added back when read. Some models' keys carry a
large constant per channel (Qwen2's key biases: in Qwen2.5-0.5B a channel's mean is up to
hundreds of times its spread), and an 8-bit float spends its 3 mantissa bits on that
constant; centred, they go to what varies between keys. Every key of a head moves by the same
vector, so a query's scores move by one constant, which the softmax cancels: a backend may
read the centred keys as they are stored. Under a logit softcap, which is not
shift-invariant, the offset stays zero.

The core's ``auto`` codec (the model's dtype) is this class; tallow-kvcache-fp8 derives its
8-bit float codecs from it.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from tallow.types import KVCodec, KVTensor

from .kv_cache import LayerKVCache, indexable, slots_to_blocks, to_cache_dtype


class CastKVCodec(KVCodec):
    """K and V cast into :meth:`storage_dtype`; ``auto``: the model's own dtype."""

    name: ClassVar[str] = "auto"
    bits_per_element: ClassVar[float] = 16.0
    #: the storage dtype; None: the model's dtype
    storage: torch.dtype | None = None

    def __init__(
        self,
        config: object = None,
        *,
        storage: torch.dtype | None = None,
        per_head_scales: bool = False,
        center_keys: bool = False,
    ) -> None:
        super().__init__(config)
        if storage is not None:  # a cast into another dtype than the class's (tests, tools)
            self.storage = storage
        self.per_head_scales = per_head_scales
        self.center_keys = center_keys
        #: the key offsets come from the engine's calibration pass
        self.calibrated = center_keys

    def storage_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        return self.storage or model_dtype

    def latent_dtype(self, model_dtype: torch.dtype) -> torch.dtype | None:
        """A latent (MLA) cache is cast into the same storage dtype as K and V."""
        return self.storage_dtype(model_dtype)

    def layout(
        self, *, num_kv_heads: int, head_dim: int, block_size: int, model_dtype: torch.dtype
    ) -> list[KVTensor]:
        dtype = self.storage_dtype(model_dtype)
        block = (block_size, num_kv_heads, head_dim)
        tensors = [KVTensor("k", block, dtype), KVTensor("v", block, dtype)]
        if self.per_head_scales:
            tensors += [
                KVTensor("k_scale", (num_kv_heads,), torch.float32, per_block=False),
                KVTensor("v_scale", (num_kv_heads,), torch.float32, per_block=False),
            ]
        if self.center_keys:
            tensors.append(
                KVTensor("k_offset", (num_kv_heads, head_dim), torch.float32, per_block=False)
            )
        return tensors

    def init_layer(self, cache: LayerKVCache) -> None:
        for name in ("k_scale", "v_scale"):
            if name in cache:
                cache[name].fill_(1.0)

    def use_checkpoint_scales(self, cache: LayerKVCache, scales: dict[str, torch.Tensor]) -> None:
        """With ``per_head_scales``, the checkpoint's ``k_scale`` and ``v_scale`` of this layer
        become its scales (one value for every head, or one per head); a codec without
        scales ignores them. Errors name the layer and what was expected."""
        if not self.per_head_scales:
            return
        layer = getattr(cache.layer, "layer_index", "?")
        missing = [name for name in ("k", "v") if name not in scales]
        if missing:
            raise ValueError(
                f"kv codec {self.name!r} stores K and V divided by the checkpoint's KV-cache "
                f"scales, but the checkpoint has no {' or '.join(f'{n}_scale' for n in missing)}"
                f" for layer {layer} (self_attn.k_scale and self_attn.v_scale)"
            )
        for name in ("k", "v"):
            given = scales[name].detach().float().flatten()
            if given.numel() not in (1, cache.num_kv_heads):
                raise ValueError(
                    f"layer {layer}: the checkpoint's {name}_scale has "
                    f"{given.numel()} values, expected 1 or one per KV head "
                    f"({cache.num_kv_heads})"
                )
            if not bool(torch.isfinite(given).all()) or not bool((given > 0).all()):
                raise ValueError(
                    f"layer {layer}: the checkpoint's {name}_scale must be positive "
                    f"and finite, got {given.tolist()}"
                )
            cache[f"{name}_scale"].copy_(given.expand(cache.num_kv_heads))

    def calibrate(
        self, cache: LayerKVCache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """``k_offset``: each head's mean key over the calibration text (zero under a logit
        softcap, where the softmax would not cancel it)."""
        if "k_offset" in cache and not getattr(cache.layer, "logit_softcap", None):
            cache["k_offset"].copy_(k.float().mean(dim=0))

    def encode(
        self, cache: LayerKVCache, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        rows, blocks, offsets = slots_to_blocks(slot_mapping, cache.block_size)
        for name, x in (("k", k), ("v", v)):
            x = x[rows]
            offset = cache.get(f"{name}_offset")
            if offset is not None:
                x = x.float() - offset
            scale = cache.get(f"{name}_scale")
            if scale is not None:
                x = x.float() / scale[:, None]
            target = cache[name]
            indexable(target)[blocks, offsets] = indexable(to_cache_dtype(x, target.dtype))

    def decode(
        self, cache: LayerKVCache, blocks: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = []
        for name in ("k", "v"):
            tensor = cache[name]
            x = indexable(tensor)[blocks].view(tensor.dtype).float()
            x = x.reshape(-1, cache.num_kv_heads, cache.head_dim)
            scale = cache.get(f"{name}_scale")
            if scale is not None:
                x = x * scale[:, None]
            offset = cache.get(f"{name}_offset")
            if offset is not None:
                x = x + offset
            out.append(x)
        return out[0], out[1]


class AutoKVCodec(CastKVCodec):
    """The default: K and V in the model's own dtype."""

    name: ClassVar[str] = "auto"
