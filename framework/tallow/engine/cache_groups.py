"""Cache groups: the layers of a model grouped by what they cache, the split of the KV budget
between the groups, and the tensors of each group.

The runner walks the model (:func:`find_cache_groups`): layers whose
:meth:`~tallow.layers.CacheLayer.cache_spec` share a group key form one group. Paged groups come
first (full attention, then sliding windows by size, then latent caches), state groups after;
the first paged group is the *primary* one, whose table is ``seq.block_ids``.

Budget (:func:`split_budget`), for ``num_blocks`` blocks of every layer that the KV memory would
hold if every group were full attention:

- a sliding group needs at most ``max_num_seqs * (ceil(window / block_size) + 1)`` blocks plus a
  step's chunk (``ceil(max_step_tokens / block_size) + 1``): it gets that, or ``num_blocks`` if
  fewer;
- the bytes it leaves go to the full (and latent) groups, which share them in proportion;
- a model with no full group gives its sliding groups all of ``num_blocks``;
- an explicit ``cache.num_blocks`` is the full groups' count: nothing is redistributed.

A sliding group's tensors hold one block more than its pool, the null block; a state group's
tensors ``[max_num_seqs + 1, *shape]``, the last row a dummy for padding rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Hashable, Sequence

import torch

from tallow.kernels import kv_cache
from tallow.kernels.host import device_tensor
from tallow.layers import (
    Attention,
    CacheSpec,
    FullAttentionSpec,
    LatentCacheSpec,
    RecurrentStateSpec,
    SlidingWindowSpec,
    StateCache,
    cache_layers,
)
from tallow.types import KVCodec

from .kv_manager import PagedGroupSize

__all__ = [
    "CacheGroup",
    "GroupCaches",
    "find_cache_groups",
    "split_budget",
    "allocate_group",
    "state_bytes",
    "latent_dtype",
]


@dataclass
class CacheGroup:
    """Layers sharing one block table (paged) or one state slot (state) per sequence."""

    key: Hashable
    spec: CacheSpec
    layers: list[Any] = field(default_factory=list)
    #: index among the paged groups, or among the state groups
    index: int = 0

    @property
    def paged(self) -> bool:
        return self.spec.paged

    @property
    def window(self) -> int | None:
        return self.spec.window if isinstance(self.spec, SlidingWindowSpec) else None


def _order(group: CacheGroup) -> tuple[int, int]:
    spec = group.spec
    if isinstance(spec, RecurrentStateSpec):
        return (3, 0)
    if isinstance(spec, LatentCacheSpec):
        return (2, 0)
    if isinstance(spec, SlidingWindowSpec):
        return (1, spec.window)
    return (0, 0)


def find_cache_groups(model: torch.nn.Module, *, sliding_groups: bool = True) -> list[CacheGroup]:
    """The cache groups of ``model``, paged groups first (see the module docstring); attention
    layers in a group are ordered by layer index. ``sliding_groups`` False puts sliding-window
    layers in the full-attention group (their blocks are then kept, their attention still
    masks by the window): a tensor-parallel step carries one group's tables."""
    by_key: dict[Hashable, CacheGroup] = {}
    for layer in cache_layers(model):
        spec = layer.cache_spec()
        if not sliding_groups and isinstance(spec, SlidingWindowSpec):
            spec = FullAttentionSpec(spec.num_kv_heads, spec.head_dim)
        group = by_key.setdefault(spec.group_key, CacheGroup(spec.group_key, spec))
        group.layers.append(layer)
    groups = sorted(by_key.values(), key=_order)
    paged = [g for g in groups if g.paged]
    states = [g for g in groups if not g.paged]
    for i, group in enumerate(paged):
        group.index = i
        if all(isinstance(m, Attention) for m in group.layers):
            group.layers.sort(key=lambda m: m.layer.layer_index)
    for i, group in enumerate(states):
        group.index = i
    return paged + states


def latent_dtype(spec: LatentCacheSpec, codec: KVCodec, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype of a latent group's tensors: the spec's own, else the KV codec's
    :meth:`~tallow.plugin.KVCodec.latent_dtype`; ValueError when the codec keeps none."""
    if spec.dtype is not None:
        return spec.dtype
    dtype = codec.latent_dtype(model_dtype)
    if dtype is None:
        raise ValueError(
            f"cache.kv_codec {codec.name!r} cannot keep a latent (MLA) cache; "
            "choose a codec that casts (auto, fp8)"
        )
    return dtype


def group_block_bytes(
    group: CacheGroup, codec: KVCodec, *, block_size: int, model_dtype: torch.dtype
) -> int:
    """Bytes of one block of every layer of paged ``group``."""
    if isinstance(group.spec, LatentCacheSpec):
        dtype = latent_dtype(group.spec, codec, model_dtype)
        return len(group.layers) * block_size * group.spec.width * dtype.itemsize
    return kv_cache.footprint(
        codec, [a.layer for a in group.layers], block_size=block_size, model_dtype=model_dtype
    ).bytes_per_block


def state_bytes(groups: list[CacheGroup], num_slots: int, model_dtype: torch.dtype) -> int:
    """Bytes of the state groups' tensors (``num_slots`` slots plus the dummy)."""
    total = 0
    for group in groups:
        if group.paged:
            continue
        for tensor in group.spec.tensors:  # type: ignore[attr-defined]
            n = 1
            for dim in tensor.shape:
                n *= dim
            total += (
                len(group.layers) * (num_slots + 1) * n * (tensor.dtype or model_dtype).itemsize
            )
    return total


def sliding_need(window: int, *, block_size: int, max_num_seqs: int, max_step_tokens: int) -> int:
    """The blocks a sliding group of ``window`` ever needs (see the module docstring)."""
    per_seq = -(-window // block_size) + 1
    return max_num_seqs * per_seq + -(-max_step_tokens // block_size) + 1


def split_budget(
    groups: list[CacheGroup],
    num_blocks: int,
    block_bytes: list[int],
    *,
    block_size: int,
    max_num_seqs: int,
    max_step_tokens: int,
    redistribute: bool = True,
) -> list[PagedGroupSize]:
    """Each paged group's pool (see the module docstring); ``block_bytes[i]``: bytes of one
    block of paged group ``i``'s layers."""
    paged = [g for g in groups if g.paged]
    sizes = []
    spare = 0
    for group, nbytes in zip(paged, block_bytes):
        if group.window is None:
            sizes.append(num_blocks)
            continue
        need = sliding_need(
            group.window,
            block_size=block_size,
            max_num_seqs=max_num_seqs,
            max_step_tokens=max_step_tokens,
        )
        blocks = min(num_blocks, need)
        sizes.append(blocks)
        spare += (num_blocks - blocks) * nbytes
    full_bytes = sum(b for g, b in zip(paged, block_bytes) if g.window is None)
    if not full_bytes:
        sizes = [num_blocks] * len(paged)
    elif redistribute and spare:
        extra = spare // full_bytes
        sizes = [n + extra if g.window is None else n for g, n in zip(paged, sizes)]
    return [PagedGroupSize(n, g.window) for g, n in zip(paged, sizes)]


def allocate_group(
    group: CacheGroup,
    codec: KVCodec,
    *,
    size: PagedGroupSize | int,
    block_size: int,
    model_dtype: torch.dtype,
    device: torch.device,
) -> list[Any]:
    """The caches of ``group``'s layers, bound to them (``size``: a paged group's pool, or a
    state group's slot count)."""
    if not group.paged:
        num_slots = int(size)  # type: ignore[arg-type]
        states: list[Any] = []
        for layer in group.layers:
            tensors = {
                t.name: torch.zeros(
                    (num_slots + 1, *t.shape), dtype=t.dtype or model_dtype, device=device
                )
                for t in group.spec.tensors  # type: ignore[attr-defined]
            }
            cache = StateCache(tensors, group.index, num_slots)
            layer.bind_cache(cache, group.index)
            states.append(cache)
        return states
    assert isinstance(size, PagedGroupSize)
    rows = size.num_blocks + (size.window is not None)  # the null block of a sliding group
    caches: list[Any]
    if isinstance(group.spec, LatentCacheSpec):
        dtype = latent_dtype(group.spec, codec, model_dtype)
        caches = [
            torch.zeros(rows, block_size, group.spec.width, dtype=dtype, device=device)
            for _ in group.layers
        ]
    else:
        caches = kv_cache.allocate(
            codec,
            [a.layer for a in group.layers],
            num_blocks=rows,
            block_size=block_size,
            model_dtype=model_dtype,
            device=device,
            checkpoint_scales=[a.kv_scales for a in group.layers],
        )
    for layer, cache in zip(group.layers, caches):
        layer.bind_cache(cache, group.index)
    return caches


class GroupCaches:
    """The tensors of every cache group of ``model``, allocated and bound to its layers: each
    paged group's pool (``group_sizes``; default ``num_blocks`` each), ``num_slots`` state
    slots per state group. The one owner of copying blocks and state slots between steps."""

    def __init__(
        self,
        model: torch.nn.Module,
        codec: KVCodec,
        *,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        num_slots: int,
        group_sizes: list[PagedGroupSize] | None = None,
        sliding_groups: bool = True,
    ) -> None:
        groups = find_cache_groups(model, sliding_groups=sliding_groups)
        self.device = device
        self.paged_groups = [g for g in groups if g.paged]
        self.state_groups = [g for g in groups if not g.paged]
        self.group_sizes = group_sizes or [
            PagedGroupSize(num_blocks, g.window) for g in self.paged_groups
        ]
        if len(self.group_sizes) != len(self.paged_groups):
            raise ValueError(
                f"{len(self.group_sizes)} group sizes for "
                f"{len(self.paged_groups)} paged cache groups"
            )
        #: per paged group, its layers' caches (the tensors blocks are copied in)
        self.paged = [
            allocate_group(
                g, codec, size=size, block_size=block_size, model_dtype=dtype, device=device
            )
            for g, size in zip(self.paged_groups, self.group_sizes)
        ]
        #: per state group, its layers' StateCaches
        self.states = [
            allocate_group(
                g, codec, size=num_slots, block_size=block_size, model_dtype=dtype, device=device
            )
            for g in self.state_groups
        ]

    def copy_blocks(self, pairs: Sequence[tuple[int, ...]]) -> None:
        """Copy-on-write: duplicate whole blocks (all layers of their group) before they
        diverge; a pair ``(src, dst)`` is of the first paged group, ``(src, dst, group)`` of
        another."""
        by_group: dict[int, list[tuple[int, ...]]] = {}
        for pair in pairs:
            by_group.setdefault(pair[2] if len(pair) > 2 else 0, []).append(pair)
        for group, own in by_group.items():
            src = device_tensor([p[0] for p in own], torch.int64, self.device)
            dst = device_tensor([p[1] for p in own], torch.int64, self.device)
            caches = self.paged[group]
            if caches and isinstance(caches[0], torch.Tensor):  # latent caches
                for cache in caches:
                    rows = kv_cache.indexable(cache)  # 8-bit floats copied as bytes
                    rows[dst] = rows[src]
            else:
                kv_cache.copy_blocks(caches, src, dst)

    def apply_state_ops(self, ops: list[tuple[int, int, int]]) -> None:
        """In order, zero the state slots sequences have just taken (``src`` -1) and copy
        forked completions' states (``src`` to ``dst``), before the forward that uses them."""
        for group, src, dst in ops:
            for cache in self.states[group]:
                for tensor in cache.tensors.values():
                    if src < 0:
                        tensor[dst].zero_()
                    else:
                        tensor[dst].copy_(tensor[src])
