"""What a layer keeps between steps: cache specs, declared by the layers themselves.

A layer module that caches something across steps answers :meth:`CacheLayer.cache_spec` with
one of the frozen specs below; the model runner walks the model, groups the layers whose specs
share a :attr:`CacheSpec.group_key` into *cache groups* and binds each layer its cache
(:meth:`CacheLayer.bind_cache`). The engine's memory manager budgets, allocates, preempts and
frees per group:

- a *paged* group (:class:`FullAttentionSpec`, :class:`SlidingWindowSpec`,
  :class:`LatentCacheSpec`) has its own pool of fixed-size blocks and one block table per
  sequence, shared by every layer of the group (each layer has its own tensors, indexed by the
  same block ids);
- a *state* group (:class:`RecurrentStateSpec`) has a pool of state slots, one per running
  sequence; each layer of the group has tensors ``[num_slots + 1, *shape]`` (the last slot is
  a dummy that padding rows of a CUDA graph write to).

See docs/architecture.md, "Cache groups", for the budget split, the null block of sliding
groups and the prefix-caching rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Hashable, Protocol, runtime_checkable

import torch

__all__ = [
    "CacheSpec",
    "FullAttentionSpec",
    "SlidingWindowSpec",
    "LatentCacheSpec",
    "StateTensorSpec",
    "RecurrentStateSpec",
    "StateCache",
    "CacheLayer",
    "cache_layers",
]


@dataclass(frozen=True)
class CacheSpec:
    """Base of every cache spec. ``paged`` specs are block-table groups; the others are
    per-sequence state."""

    paged: ClassVar[bool] = True

    @property
    def group_key(self) -> Hashable:
        """Layers whose specs have equal keys share one cache group (one block table or one
        state slot per sequence)."""
        return (type(self).__name__,)


@dataclass(frozen=True)
class FullAttentionSpec(CacheSpec):
    """Paged K/V of every token of the sequence (causal or bidirectional attention)."""

    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class SlidingWindowSpec(CacheSpec):
    """Paged K/V of a sliding-window layer: a query at position ``p`` reads keys ``k`` with
    ``p - k < window`` only, so blocks whose every token is older than the window of any
    future query go back to the pool while the sequence runs (their table entries then name
    the group's null block)."""

    num_kv_heads: int
    head_dim: int
    window: int

    def __post_init__(self) -> None:
        if not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"window must be a positive integer, got {self.window!r}")

    @property
    def group_key(self) -> Hashable:
        return ("SlidingWindowSpec", self.window)


@dataclass(frozen=True)
class LatentCacheSpec(CacheSpec):
    """A latent cache (multi-head latent attention, MLA): paged like K/V, one vector of
    ``width`` per token shared by all heads, kept in ``dtype`` (None: the KV codec's
    :meth:`~tallow.plugin.KVCodec.latent_dtype` for the model's dtype).

    The engine allocates, budgets and keeps the block tables of such a group like a full
    attention group; :class:`tallow.layers.MLAAttention` declares it and reads it through
    the attention backend's ``forward_mla``."""

    width: int
    dtype: torch.dtype | None = None

    @property
    def group_key(self) -> Hashable:
        return ("LatentCacheSpec", self.width, self.dtype)


@dataclass(frozen=True)
class StateTensorSpec:
    """One tensor of a recurrent state: ``shape`` per sequence, in ``dtype`` (None: the
    model's dtype)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype | None = None


@dataclass(frozen=True)
class RecurrentStateSpec(CacheSpec):
    """A fixed-size state per sequence (e.g. a short causal convolution's last inputs and an
    SSM / delta-rule state), whatever the sequence's length. A sequence takes a state slot when
    it is first scheduled and gives it back when it finishes, is aborted or is preempted; a
    preempted sequence is recomputed from its first token, and a slot is zeroed each time it
    is taken. Prefix caching is refused for models with a state group (a cached prefix would
    need the state at the hit point)."""

    paged: ClassVar[bool] = False

    tensors: tuple[StateTensorSpec, ...]

    def __post_init__(self) -> None:
        names = [t.name for t in self.tensors]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"a recurrent state needs tensors with distinct names, got {names!r}")

    @property
    def group_key(self) -> Hashable:
        return ("RecurrentStateSpec", self.tensors)


class StateCache:
    """The state tensors of one layer of a state group, bound by the model runner.

    ``tensors[name]`` is ``[num_slots + 1, *shape]``: row ``s`` is the state of the sequence
    holding slot ``s``; row ``num_slots`` is the dummy slot of padding rows. ``group`` is the
    state group's index: the layer reads its rows' slots as
    ``get_forward_context().meta.state_slots[group]`` (int64, one per sequence of the step)."""

    __slots__ = ("tensors", "group", "num_slots")

    def __init__(self, tensors: dict[str, torch.Tensor], group: int, num_slots: int) -> None:
        self.tensors = tensors
        self.group = group
        self.num_slots = num_slots

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]


@runtime_checkable
class CacheLayer(Protocol):
    """A module that keeps a cache across steps (:class:`tallow.layers.Attention` is one)."""

    def cache_spec(self) -> CacheSpec:
        """What the layer caches."""
        ...

    def bind_cache(
        self, cache: Any, group: int
    ) -> None:  # Any: a LayerKVCache, a latent tensor or a StateCache, by spec
        """Take the cache the runner allocated: a :class:`tallow.kernels.kv_cache.LayerKVCache`
        for attention groups, a tensor ``[blocks, block_size, width]`` for latent groups, a
        :class:`StateCache` for state groups; ``group`` is the index of the layer's group
        among the paged groups (or among the state groups)."""
        ...


def cache_layers(model: torch.nn.Module) -> list[Any]:
    """The modules of ``model`` that declare a cache, in module order."""
    return [
        m
        for m in model.modules()
        if callable(getattr(m, "cache_spec", None)) and callable(getattr(m, "bind_cache", None))
    ]
