"""The attention layer of model plugins and the per-step metadata it reads.

Model code calls :class:`Attention` with flat ``q``/``k``/``v``; everything about the batch
(where each sequence's tokens start, its block table, where to store new K/V) lives in the
:class:`AttentionMetadata` the model runner puts in the forward context before each step. The
chosen :class:`tallow.plugin.AttentionBackend` does the work.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Protocol

import torch
from torch import nn

# defined below the AttentionBackend contract that takes them, re-exported here
from tallow.types import AttentionLayer as AttentionLayer
from tallow.types import AttentionMetadata as AttentionMetadata
from tallow.types import LayerKVCache, MLALayer

from .cache_spec import CacheSpec, FullAttentionSpec, SlidingWindowSpec
from .linear_method import set_weight_attrs


class AttentionImpl(Protocol):
    """What a forward context runs attention with: a :class:`tallow.plugin.AttentionBackend`
    (declared here, below the plugin API, by the methods the layers call)."""

    def forward(
        self,
        layer: AttentionLayer,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: LayerKVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor: ...

    def forward_mla(
        self,
        layer: MLALayer,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        latent: torch.Tensor,
        cache: torch.Tensor,
        w_uk: torch.Tensor,
        w_uv: torch.Tensor,
        meta: AttentionMetadata,
    ) -> torch.Tensor: ...


@dataclass
class ForwardContext:
    meta: AttentionMetadata
    backend: AttentionImpl


_context: list[ForwardContext] = []


@contextlib.contextmanager
def forward_context(meta: AttentionMetadata, backend: AttentionImpl) -> Iterator[ForwardContext]:
    """Make ``meta`` and ``backend`` visible to every :class:`Attention` during one forward.

    One forward is one step: the backend's ``plan(meta)`` (when it has one) runs first, once,
    before any layer (outside any CUDA graph being captured in the block)."""
    plan = getattr(backend, "plan", None)
    if plan is not None:
        plan(meta)
    ctx = ForwardContext(meta, backend)
    _context.append(ctx)
    try:
        yield ctx
    finally:
        _context.pop()


def get_forward_context() -> ForwardContext:
    if not _context:
        raise RuntimeError(
            "Attention was called outside a forward context: run the model through the engine's "
            "model runner (or tallow.layers.attention.forward_context) so it knows the batch"
        )
    return _context[-1]


class Attention(nn.Module):
    """Paged attention for one layer. The model runner binds ``kv_cache`` (a
    :class:`tallow.kernels.kv_cache.LayerKVCache`) after allocation.

    ``forward(q [T, Hq*D], k [T, Hkv*D], v [T, Hkv*D]) -> [T, Hq*D]``.

    **Head counts are per tensor-parallel rank**: ``num_heads`` (``Hq``) and ``num_kv_heads``
    (``Hkv``) are the heads whose q, k and v this rank computes, not the model's totals. With
    ``tp_size`` 1 the two are the same; with more ranks pass the counts of the rank's
    projection, ``num_heads`` and ``num_kv_heads`` of
    :class:`~tallow.layers.QKVParallelLinear` (which takes the totals and divides them,
    replicating KV heads when there are fewer than ranks). The model runner sizes each
    layer's KV cache from these counts, and backends read ``Hq / Hkv`` as the grouped-query
    ratio. ``scale`` defaults to ``head_dim ** -0.5``.

    ``sinks=True`` (gpt-oss) gives the layer a parameter ``sinks`` (float32 ``[num_heads]``,
    this rank's heads): one learned logit per query head that joins the softmax denominator
    (see :class:`AttentionLayer`). Its checkpoint tensor holds every head of the model;
    ``sinks_head_offset`` is the index of this rank's first query head in it
    (``tp_rank * num_heads``); ``device`` is where the parameter lives.

    ``attention_chunk_size`` (Llama 4's chunked local attention): each query sees only the
    keys of its own chunk of that many positions. The layer keeps a full cache.
    """

    def __init__(
        self,
        layer_index: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float | None = None,
        sliding_window: int | None = None,
        logit_softcap: float | None = None,
        causal: bool = True,
        *,
        sinks: bool = False,
        sinks_head_offset: int = 0,
        attention_chunk_size: int | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}"
            )
        if sliding_window and not causal:
            raise ValueError("a sliding window needs causal attention (causal=True)")
        if attention_chunk_size is not None and (int(attention_chunk_size) < 1 or not causal):
            raise ValueError(
                f"attention_chunk_size must be a positive number of tokens on a "
                f"causal layer, got {attention_chunk_size} (causal={causal})"
            )
        self.sinks: nn.Parameter | None = None
        if sinks:
            self.sinks = nn.Parameter(
                torch.zeros(num_heads, dtype=torch.float32, device=device), requires_grad=False
            )
            self.sinks_head_offset = int(sinks_head_offset)
            set_weight_attrs(self.sinks, weight_loader=self._load_sinks)
        self.layer = AttentionLayer(
            layer_index=layer_index,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            scale=scale if scale is not None else head_dim**-0.5,
            sliding_window=sliding_window or None,
            logit_softcap=logit_softcap or None,
            causal=bool(causal),
            sinks=self.sinks,
            attention_chunk_size=int(attention_chunk_size) if attention_chunk_size else None,
        )
        self.kv_cache: LayerKVCache | None = None
        #: the paged cache group whose block tables this layer reads (set by bind_cache)
        self.cache_group = 0
        #: scales of this layer's K and V cache read from a checkpoint (``"k"``, ``"v"``: one
        #: value, or one per KV head), handed to the KV codec (``use_checkpoint_scales``)
        self.kv_scales: dict[str, torch.Tensor] = {}

    def _load_sinks(
        self, param: torch.Tensor, loaded: torch.Tensor, shard_id: object = None
    ) -> None:
        """The checkpoint's sinks of every query head; this rank keeps its own heads'."""
        n, start = param.shape[0], self.sinks_head_offset
        if shard_id is not None:
            raise ValueError(f"attention sinks have no shards, got {shard_id!r}")
        if loaded.dim() != 1 or loaded.shape[0] < start + n:
            raise ValueError(
                f"attention sinks: checkpoint tensor has shape "
                f"{tuple(loaded.shape)}, expected one value per query head "
                f"(at least {start + n})"
            )
        with torch.no_grad():
            param.copy_(loaded.narrow(0, start, n).float())

    def cache_spec(self) -> CacheSpec:
        """Paged K/V, of a sliding window when the layer has one."""
        spec = self.layer
        if spec.sliding_window:
            return SlidingWindowSpec(spec.num_kv_heads, spec.head_dim, spec.sliding_window)
        return FullAttentionSpec(spec.num_kv_heads, spec.head_dim)

    def bind_cache(self, cache: "LayerKVCache", group: int) -> None:
        self.kv_cache = cache
        self.cache_group = group

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ctx = get_forward_context()
        if self.kv_cache is None:
            raise RuntimeError(f"attention layer {self.layer.layer_index} has no KV cache bound")
        n = q.shape[0]
        spec = self.layer
        out = ctx.backend.forward(
            spec,
            q.view(n, spec.num_heads, spec.head_dim),
            k.view(n, spec.num_kv_heads, spec.head_dim),
            v.view(n, spec.num_kv_heads, spec.head_dim),
            self.kv_cache,
            ctx.meta.group(self.cache_group),
        )
        return out.reshape(n, spec.num_heads * spec.head_dim)

    def extra_repr(self) -> str:
        s = self.layer
        return (
            f"layer={s.layer_index}, heads={s.num_heads}, kv_heads={s.num_kv_heads}, "
            f"head_dim={s.head_dim}, window={s.sliding_window}, softcap={s.logit_softcap}"
            + ("" if s.causal else ", causal=False")
            + (", sinks" if s.sinks is not None else "")
            + (f", chunk={s.attention_chunk_size}" if s.attention_chunk_size else "")
        )


class SharedKVAttention(nn.Module):
    """Attention over the K/V cache of an earlier layer (KV sharing: Gemma 4's last
    ``num_kv_shared_layers`` layers reuse the K/V of the last earlier layer of their kind).

    ``forward(q [T, Hq*D]) -> [T, Hq*D]``: the layer computes no K/V and keeps no cache. It
    is not an :class:`Attention` and declares no cache spec, so the runner allocates nothing
    for it; each step it reads ``source``'s cache and ``source``'s view of the step (the
    block tables of the source's cache group). The source runs first in the model's forward,
    so this step's K/V are already stored when this layer attends. The backend gets an
    :class:`AttentionLayer` with ``kv_shared_from`` = the source's layer index and placeholder
    ``k``/``v``, and stores nothing for it; backends without ``supports_kv_sharing`` are
    refused such models.

    The KV heads, head size, sliding window and causality are the source's (a window of its
    own would read blocks the source's group has already freed); ``num_heads``, ``scale`` and
    ``logit_softcap`` are this layer's. The source is held outside the module tree (it is
    registered where the model built it).
    """

    def __init__(
        self,
        layer_index: int,
        source: Attention,
        num_heads: int,
        scale: float | None = None,
        logit_softcap: float | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(source, Attention):
            raise TypeError(
                f"SharedKVAttention (layer {layer_index}): source must be an Attention "
                f"layer that keeps its own cache, got {type(source).__name__}"
            )
        src = source.layer
        if src.layer_index >= layer_index:
            raise ValueError(
                f"SharedKVAttention (layer {layer_index}): the source layer "
                f"{src.layer_index} must come earlier in the model"
            )
        if num_heads % src.num_kv_heads:
            raise ValueError(
                f"SharedKVAttention (layer {layer_index}): num_heads {num_heads} is not a "
                f"multiple of the source layer's num_kv_heads {src.num_kv_heads}"
            )
        self.layer = AttentionLayer(
            layer_index=layer_index,
            num_heads=num_heads,
            num_kv_heads=src.num_kv_heads,
            head_dim=src.head_dim,
            scale=scale if scale is not None else src.head_dim**-0.5,
            sliding_window=src.sliding_window,
            logit_softcap=logit_softcap or None,
            causal=src.causal,
            attention_chunk_size=src.attention_chunk_size,
            kv_shared_from=src.layer_index,
        )
        # a tuple keeps the source out of this module's children (and its state dict)
        self._source: tuple[Attention] = (source,)

    @property
    def source(self) -> Attention:
        """The layer whose cache this one reads."""
        return self._source[0]

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        ctx = get_forward_context()
        source = self.source
        if source.kv_cache is None:
            raise RuntimeError(
                f"attention layer {self.layer.layer_index} shares the KV cache of layer "
                f"{source.layer.layer_index}, which has no KV cache bound"
            )
        n = q.shape[0]
        spec = self.layer
        # k/v placeholders of the shape backends check, no memory: nothing is stored
        placeholder = q.new_zeros(()).expand(n, spec.num_kv_heads, spec.head_dim)
        out = ctx.backend.forward(
            spec,
            q.view(n, spec.num_heads, spec.head_dim),
            placeholder,
            placeholder,
            source.kv_cache,
            ctx.meta.group(source.cache_group),
        )
        return out.reshape(n, spec.num_heads * spec.head_dim)

    def extra_repr(self) -> str:
        s = self.layer
        return (
            f"layer={s.layer_index}, heads={s.num_heads}, kv_shared_from={s.kv_shared_from}, "
            f"head_dim={s.head_dim}, window={s.sliding_window}, softcap={s.logit_softcap}"
        )


def shared_kv_layers(model: nn.Module) -> list[SharedKVAttention]:
    """The KV-sharing attention layers of ``model``, by layer index."""
    found = [m for m in model.modules() if isinstance(m, SharedKVAttention)]
    return sorted(found, key=lambda m: m.layer.layer_index)
