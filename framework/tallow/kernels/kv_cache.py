"""The paged KV cache: the one owner of how K and V are stored.

A KV codec (:class:`tallow.plugin.KVCodec`) lays out the tensors of one attention layer's
cache (codes, scales, ...). This module turns layouts into memory and answers every question
about it: it checks a layout, allocates the tensors of each layer (:class:`LayerKVCache`, what
attention backends receive), sizes the KV budget from their bytes per block, copies blocks for
copy-on-write, states a codec's capacity against a 16-bit cache, and holds the dtype rules of
caches in 8-bit floats (the clamp before the cast, byte views for indexing, the GPUs whose
Triton converts e4m3). The engine, the model runner and the attention backends go through it;
none of them allocates or indexes cache tensors by its own rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch

from tallow.types import KVCodec, KVTensor
from tallow.types import LayerKVCache as LayerKVCache  # defined below the contracts that take it

#: bytes of one element of the 16-bit cache that capacities are compared with
REFERENCE_BYTES = 2
#: lowest CUDA compute capability (Ada) where Triton converts to and from float8_e4m3fn
E4M3_MIN_CAPABILITY = (8, 9)


# -- dtype rules -------------------------------------------------------------------------------
def cache_saturation(dtype: torch.dtype) -> float:
    """The magnitude values are clamped to before they are cast into a cache tensor of
    ``dtype``: the largest finite value of an 8-bit float (which has no infinity, so an
    overflowing cast would give NaN), 0.0 (no clamp) for other dtypes."""
    if dtype.is_floating_point and dtype.itemsize == 1:
        return float(torch.finfo(dtype).max)
    return 0.0


def to_cache_dtype(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` as a cache tensor of ``dtype`` holds it: clamped (:func:`cache_saturation`),
    then rounded to nearest even."""
    limit = cache_saturation(dtype)
    if limit:
        x = x.clamp(-limit, limit)
    return x.to(dtype)


def indexable(t: torch.Tensor) -> torch.Tensor:
    """``t`` in a form every torch index operation takes: an 8-bit float tensor as a view of
    its bytes (uint8; not every gather or scatter is implemented for 8-bit floats), others as
    they are. Copying the bytes copies the values exactly."""
    return t.view(torch.uint8) if t.dtype.is_floating_point and t.dtype.itemsize == 1 else t


def float8_reasons(dtype: torch.dtype, capability: tuple[int, ...] | None) -> list[str]:
    """Why Triton kernels cannot convert to and from ``dtype`` on a GPU of compute
    ``capability`` (None: not a GPU; empty when they can): e4m3 needs
    :data:`E4M3_MIN_CAPABILITY`."""
    if dtype != torch.float8_e4m3fn or capability is None:
        return []
    if tuple(capability) >= E4M3_MIN_CAPABILITY:
        return []
    need = ".".join(map(str, E4M3_MIN_CAPABILITY))
    return [
        f"float8_e4m3fn needs CUDA compute capability {need} (Triton has no e4m3 "
        f"conversions below it), this device has {capability[0]}.{capability[1]}"
    ]


# -- layouts ----------------------------------------------------------------------------------
def tensor_bytes(spec: KVTensor) -> int:
    """Bytes of one block of a paged tensor, or of the whole tensor otherwise."""
    n = 1
    for dim in spec.shape:
        n *= dim
    return n * torch.empty((), dtype=spec.dtype).element_size()


def layer_layout(
    codec: KVCodec, *, num_kv_heads: int, head_dim: int, block_size: int, model_dtype: torch.dtype
) -> list[KVTensor]:
    """``codec``'s layout of one layer, checked: unique names, torch dtypes, positive sizes,
    and at least one paged tensor. Errors name the codec and the tensor."""
    layout = list(
        codec.layout(
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            block_size=block_size,
            model_dtype=model_dtype,
        )
    )
    where = f"kv codec {codec.name!r} (head size {head_dim}, {num_kv_heads} KV heads)"
    seen: set[str] = set()
    for spec in layout:
        if not isinstance(spec, KVTensor):
            raise TypeError(f"{where}: layout() must return KVTensor items, got {spec!r}")
        if spec.name in seen:
            raise ValueError(f"{where}: tensor name {spec.name!r} appears twice in its layout")
        seen.add(spec.name)
        if not isinstance(spec.dtype, torch.dtype):
            raise TypeError(
                f"{where}: tensor {spec.name!r} has dtype {spec.dtype!r}, expected a torch.dtype"
            )
        if not spec.shape or any(not isinstance(d, int) or d < 1 for d in spec.shape):
            raise ValueError(
                f"{where}: tensor {spec.name!r} has shape {spec.shape!r}, expected "
                "positive integer sizes"
            )
    if not any(spec.per_block for spec in layout):
        raise ValueError(f"{where}: the layout has no paged (per_block) tensor")
    return layout


@dataclass(frozen=True)
class KVFootprint:
    """What a codec's cache costs for a model's attention layers."""

    #: bytes of one block of every layer's paged tensors
    bytes_per_block: int
    #: bytes allocated once per model, whatever the block count (per-layer tensors)
    fixed_bytes: int
    block_size: int
    #: bytes per token of a 16-bit cache of the same layers (K and V, no scales)
    reference_bytes_per_token: int

    @property
    def bytes_per_token(self) -> float:
        return self.bytes_per_block / self.block_size

    @property
    def tokens_per_gib(self) -> float:
        return (1 << 30) / self.bytes_per_token

    @property
    def vs_bf16(self) -> float:
        """Tokens per byte relative to a 16-bit cache, scales included."""
        return self.reference_bytes_per_token / self.bytes_per_token

    def tokens(self, num_blocks: int) -> int:
        return num_blocks * self.block_size


def footprint(
    codec: KVCodec, layers: Iterable[Any], *, block_size: int, model_dtype: torch.dtype
) -> KVFootprint:
    """The :class:`KVFootprint` of ``codec`` over ``layers`` (objects with ``num_kv_heads``
    and ``head_dim``, e.g. :class:`tallow.layers.AttentionLayer`)."""
    per_block = fixed = reference = 0
    for layer in layers:
        for spec in layer_layout(
            codec,
            num_kv_heads=layer.num_kv_heads,
            head_dim=layer.head_dim,
            block_size=block_size,
            model_dtype=model_dtype,
        ):
            if spec.per_block:
                per_block += tensor_bytes(spec)
            else:
                fixed += tensor_bytes(spec)
        reference += 2 * layer.num_kv_heads * layer.head_dim * REFERENCE_BYTES
    return KVFootprint(per_block, fixed, block_size, reference)


def allocate_layer(
    codec: KVCodec,
    *,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    num_blocks: int,
    model_dtype: torch.dtype,
    device: torch.device | str = "cpu",
    layer: Any = None,  # Any: as LayerKVCache.layer
    checkpoint_scales: dict[str, torch.Tensor] | None = None,
) -> LayerKVCache:
    """One layer's cache of ``num_blocks`` blocks, zeroed, its per-layer tensors filled by the
    codec (:meth:`KVCodec.init_layer`, then :meth:`KVCodec.use_checkpoint_scales` with
    ``checkpoint_scales`` when they are given: the model's, empty when its checkpoint has
    none). ``layer`` is the attention layer it serves, if known."""
    layout = layer_layout(
        codec,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        model_dtype=model_dtype,
    )
    tensors = {}
    for spec in layout:
        shape = (num_blocks, *spec.shape) if spec.per_block else spec.shape
        tensors[spec.name] = torch.zeros(shape, dtype=spec.dtype, device=device)
    cache = LayerKVCache(
        codec,
        tensors,
        layout=layout,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        model_dtype=model_dtype,
        layer=layer,
    )
    codec.init_layer(cache)
    if checkpoint_scales is not None:
        codec.use_checkpoint_scales(cache, checkpoint_scales)
    return cache


def allocate(
    codec: KVCodec,
    layers: Iterable[Any],
    *,
    num_blocks: int,
    block_size: int,
    model_dtype: torch.dtype,
    device: torch.device | str,
    checkpoint_scales: Sequence[dict[str, torch.Tensor]] | None = None,
) -> list[LayerKVCache]:
    """The caches of ``layers`` (objects with ``num_kv_heads`` and ``head_dim``, e.g.
    :class:`tallow.layers.AttentionLayer`), in order; ``checkpoint_scales``: each layer's
    KV-cache scales from the checkpoint (:attr:`tallow.layers.Attention.kv_scales`)."""
    layers = list(layers)
    scales: Sequence[dict[str, torch.Tensor] | None] = (
        [None] * len(layers) if checkpoint_scales is None else checkpoint_scales
    )
    if len(scales) != len(layers):
        raise ValueError(f"checkpoint_scales has {len(scales)} entries for {len(layers)} layers")
    return [
        allocate_layer(
            codec,
            num_kv_heads=layer.num_kv_heads,
            head_dim=layer.head_dim,
            block_size=block_size,
            num_blocks=num_blocks,
            model_dtype=model_dtype,
            device=device,
            layer=layer,
            checkpoint_scales=layer_scales,
        )
        for layer, layer_scales in zip(layers, scales)
    ]


def copy_blocks(caches: Iterable[LayerKVCache], src: torch.Tensor, dst: torch.Tensor) -> None:
    """Copy-on-write: block ``src[i]`` of every paged tensor of every layer into ``dst[i]``
    (int64 device tensors), byte for byte. Per-layer tensors are shared, not copied."""
    for cache in caches:
        for tensor in cache.paged():
            raw = indexable(tensor)
            raw[dst] = raw[src]


def slots_to_blocks(
    slot_mapping: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows kept, their blocks, their offsets) of a step's slot mapping: rows with slot -1
    are dropped. For reference encoders, which index with the results."""
    keep = (slot_mapping >= 0).nonzero().flatten()
    slots = slot_mapping[keep].long()
    return keep, torch.div(slots, block_size, rounding_mode="floor"), slots % block_size
