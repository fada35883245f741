"""The turbo8, turbo4 and turbo3 KV codecs: the cache layout and the torch reference.

One layer's cache (:meth:`TurboKVCodec.layout`):

==============  ==========================  ========  ======================================
tensor          shape                       dtype     holds
==============  ==========================  ========  ======================================
``k_codes``     [blocks, bs, Hkv, D*b/8]    uint8     packed codes of transformed keys
``k_scales``    [blocks, bs, Hkv]           float16   one scale per token and head
``v_codes``     [blocks, bs, Hkv, D*b/8]    uint8     packed codes of transformed values
``v_scales``    [blocks, bs, Hkv]           float16
``k_offset``    [Hkv, D] (per layer)        float32   ``m``: subtracted from every key
``k_smooth``    [Hkv, D] (per layer)        float32   ``s``: keys divided, queries multiplied
``v_offset``    [Hkv, D] (per layer)        float32   ``m_v`` (center_values): less every value
``rotation``    [D, D] (per layer)          float32   ``R``: stored vectors are ``x @ R.T``
==============  ==========================  ========  ======================================

Encoding: a key ``k`` of head ``h`` becomes ``y = ((k - m[h]) / s[h]) @ R.T``, a value
``y = (v - m_v[h]) @ R.T`` (float32), then :func:`~tallow_kvcache_turboquant.quantize.
quantize` and ``pack``. Decoding inverts it: ``k = (y @ R) * s[h] + m[h]``,
``v = y @ R + m_v[h]``. ``m``, ``s`` and ``m_v`` come from the engine's calibration pass
(:mod:`~tallow_kvcache_turboquant.calibration`; zero offsets and unit smoothing until
then). The settings ``rotation``, ``center_keys``, ``smooth_keys`` and ``center_values``
leave the corresponding tensor out (no rotation: plain per-token scalar quantization).

A backend that implements the format in its own kernels reads the codes where they live:
it transforms each query once, ``q' = (q * s[h]) @ R.T``, so that ``q' . y = q . (k - m)``
and keys are never transformed back in its inner loop; it may leave ``m`` out, since every
key of the head carries it and the softmax cancels the common ``q . m`` (the offset is zero
under a logit softcap); and it transforms the attention output back once,
``out = out' @ R + m_v[h]``, the output being a mix of stored values whose softmax weights
sum to one.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tallow.kernels import LayerKVCache, slots_to_blocks
from tallow.plugin import KVCodec, KVTensor

from .calibration import key_offset, key_smoothing, value_offset
from .quantize import code_bytes, dequantize, pack, quantize, unpack
from .rotation import rotation_matrix
from .settings import turbo_settings


class TurboKVCodec(KVCodec):
    """K and V transformed (offset, smoothing, rotation), then quantized to :attr:`bits`
    bits with a float16 scale per token and head."""

    bits: ClassVar[int] = 4
    calibrated: ClassVar[bool] = True

    def __init__(self, config: Any = None) -> None:
        super().__init__(config)
        settings = turbo_settings(config)
        self.rotation = settings.rotation
        self.center_keys = settings.center_keys
        self.smooth_keys = settings.smooth_keys
        self.center_values = settings.center_values
        self.seed = settings.seed

    def layout(
        self, *, num_kv_heads: int, head_dim: int, block_size: int, model_dtype: torch.dtype
    ) -> list[KVTensor]:
        codes = (block_size, num_kv_heads, code_bytes(head_dim, self.bits))
        scales = (block_size, num_kv_heads)
        per_head = (num_kv_heads, head_dim)
        tensors = [
            KVTensor("k_codes", codes, torch.uint8),
            KVTensor("k_scales", scales, torch.float16),
            KVTensor("v_codes", codes, torch.uint8),
            KVTensor("v_scales", scales, torch.float16),
        ]
        for name, wanted in (
            ("k_offset", self.center_keys),
            ("k_smooth", self.smooth_keys),
            ("v_offset", self.center_values),
        ):
            if wanted:
                tensors.append(KVTensor(name, per_head, torch.float32, per_block=False))
        if self.rotation:
            tensors.append(
                KVTensor("rotation", (head_dim, head_dim), torch.float32, per_block=False)
            )
        return tensors

    def init_layer(self, cache: LayerKVCache) -> None:
        if "rotation" in cache:
            cache["rotation"].copy_(rotation_matrix(cache.head_dim, self.seed))
        if "k_smooth" in cache:
            cache["k_smooth"].fill_(1.0)

    def calibrate(
        self, cache: LayerKVCache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Offsets and smoothing from this layer's calibration Q/K/V
        (:mod:`~tallow_kvcache_turboquant.calibration`)."""
        offset = torch.zeros_like(cache["k_offset"]) if "k_offset" in cache else None
        if offset is not None and not getattr(cache.layer, "logit_softcap", None):
            offset = key_offset(k).to(offset.device)
            cache["k_offset"].copy_(offset)
        if "k_smooth" in cache:
            base = offset if offset is not None else torch.zeros(k.shape[1:], device=k.device)
            cache["k_smooth"].copy_(key_smoothing(q, k, base.to(k.device)))
        if "v_offset" in cache:
            cache["v_offset"].copy_(value_offset(v))

    def encode(
        self, cache: LayerKVCache, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        rows, blocks, offsets = slots_to_blocks(slot_mapping, cache.block_size)
        for name, x in (("k", k), ("v", v)):
            y = to_stored(cache, name, x[rows].float())
            codes, scales = quantize(y, self.bits)
            cache[f"{name}_codes"][blocks, offsets] = pack(codes, self.bits)
            cache[f"{name}_scales"][blocks, offsets] = scales

    def decode(
        self, cache: LayerKVCache, blocks: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        out = []
        for name in ("k", "v"):
            codes = unpack(cache[f"{name}_codes"][blocks], self.bits, cache.head_dim)
            y = dequantize(codes, cache[f"{name}_scales"][blocks], self.bits)
            out.append(from_stored(cache, name, y.reshape(-1, cache.num_kv_heads, cache.head_dim)))
        return out[0], out[1]


def to_stored(cache: LayerKVCache, name: str, x: torch.Tensor) -> torch.Tensor:
    """Keys (``name`` "k") or values [N, Hkv, D] (float32) as the cache stores them, before
    quantization: less their offset, keys divided by their smoothing, rotated."""
    offset, smooth = cache.get(f"{name}_offset"), cache.get(f"{name}_smooth")
    if offset is not None:
        x = x - offset
    if smooth is not None:
        x = x / smooth
    rotation = cache.get("rotation")
    return x @ rotation.T if rotation is not None else x


def from_stored(cache: LayerKVCache, name: str, y: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`to_stored`."""
    rotation = cache.get("rotation")
    x = y @ rotation if rotation is not None else y
    offset, smooth = cache.get(f"{name}_offset"), cache.get(f"{name}_smooth")
    if smooth is not None:
        x = x * smooth
    if offset is not None:
        x = x + offset
    return x


class Turbo8KVCodec(TurboKVCodec):
    name: ClassVar[str] = "turbo8"
    bits: ClassVar[int] = 8
    bits_per_element: ClassVar[float] = 8.0


class Turbo4KVCodec(TurboKVCodec):
    name: ClassVar[str] = "turbo4"
    bits: ClassVar[int] = 4
    bits_per_element: ClassVar[float] = 4.0


class Turbo3KVCodec(TurboKVCodec):
    name: ClassVar[str] = "turbo3"
    bits: ClassVar[int] = 3
    bits_per_element: ClassVar[float] = 3.0
