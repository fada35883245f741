"""The contracts that the core's lowest layers implement and the plugin API hands to plugins:
the :class:`Component` base of everything a registry holds, and the KV-cache and attention
contracts (:class:`KVTensor`, :class:`KVCodec`, :class:`AttentionBackend`) that
:mod:`tallow.kernels` and :mod:`tallow.layers` build on, with the types those contracts'
methods take (:class:`LayerKVCache`, re-exported by :mod:`tallow.kernels.kv_cache`;
:class:`AttentionLayer` and :class:`AttentionMetadata`, re-exported by :mod:`tallow.layers`);
and :class:`HostBatch`, one step's
flat batch as host arrays, which the engine's model runner builds and a tensor-parallel step
message (:mod:`tallow.distributed.step_message`) carries to the workers.

They sit below every other module of the core (docs/architecture.md, "Layers") so that the
kernels and layers need not import :mod:`tallow.plugin`, which re-exports them for plugins.
Like the rest of the plugin API they import no torch: tensor types appear only in annotations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import torch

__all__ = [
    "AttentionBackend",
    "AttentionLayer",
    "AttentionMetadata",
    "Component",
    "HostBatch",
    "KVCodec",
    "KVTensor",
    "LayerKVCache",
    "MLALayer",
]


class Component:
    """Anything a registry can hold.

    ``validate(config)`` returns the reasons this component cannot serve ``config`` (empty when
    it can); selection (:func:`tallow.plugin.select`) relies on it. ``config`` is None where a
    kind is chosen without one (weight formats by their source, tool parsers by the model).
    """

    name: ClassVar[str] = ""

    @classmethod
    def validate(cls, config: Any) -> list[str]:
        # Any: a tallow.config.TallowConfig or None; the configuration sits above tallow.types
        # (docs/architecture.md, "Layers"), and subclasses take it as ``TallowConfig | None``
        return []


@dataclass(frozen=True)
class KVTensor:
    """One tensor of an attention layer's KV cache, as a :class:`KVCodec` lays it out.

    A ``per_block`` tensor is paged: it is allocated ``[num_blocks, *shape]`` (``shape`` is one
    block, block size first), its blocks are handed out by the block manager and copied for
    copy-on-write. Any other tensor is allocated with ``shape`` once per layer, for what the
    whole layer shares (a scale per head, a rotation), and filled by
    :meth:`KVCodec.init_layer`.
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    per_block: bool = True


class KVCodec(Component):
    """How K and V are stored in the paged cache: the layout of the cache tensors of one
    attention layer, and a plain-torch reference of writing into them and reading from them.

    - :meth:`layout` lists the tensors of one layer (:class:`KVTensor`): codes, scales, ...;
      :mod:`tallow.kernels.kv_cache` allocates them, sizes the KV budget from their bytes per
      block, copies their blocks and hands them to attention backends as a
      :class:`tallow.kernels.kv_cache.LayerKVCache`;
    - :meth:`init_layer` fills the per-layer tensors once they are allocated,
      :meth:`use_checkpoint_scales` may take scales the checkpoint carries, and, for a codec
      that sets :attr:`calibrated`, :meth:`calibrate` refines them from the K/V the model
      computes over a calibration text;
    - :meth:`encode` writes one step's K/V into the cache at their slots;
    - :meth:`decode` reads whole blocks back as K/V.

    The references define the format: the torch attention backend runs on them, and a backend
    that implements a codec in its own kernels (it names the codec in
    :attr:`AttentionBackend.fused_kv_codecs`) is tested against them.

    ``bits_per_element`` is the nominal storage of one K or V element without the scales that
    go with it, for listings (registered as ``bits=`` too, so that listing plugins imports
    nothing). The codec is built with the configuration (a
    :class:`tallow.config.TallowConfig`, or None in tests) and reads its plugin's settings
    from it.
    """

    bits_per_element: ClassVar[float] = 16.0
    #: True when :meth:`calibrate` wants the K/V a model computes over a calibration text:
    #: the engine then runs that pass once at start-up, before serving
    calibrated: bool = False

    def __init__(self, config: object = None) -> None:
        # object: the codec's storage is the kernels' concern, below the configuration; the
        # config is passed through to plugin_settings
        self.config = config

    def layout(
        self, *, num_kv_heads: int, head_dim: int, block_size: int, model_dtype: "torch.dtype"
    ) -> list[KVTensor]:
        """The tensors of one layer's cache for heads of ``head_dim`` elements."""
        raise NotImplementedError

    def init_layer(self, cache: LayerKVCache) -> None:
        """Fill the per-layer tensors of ``cache`` (a freshly allocated ``LayerKVCache``);
        the default has none to fill."""

    def use_checkpoint_scales(self, cache: LayerKVCache, scales: dict[str, "torch.Tensor"]) -> None:
        """Take the scales the model's checkpoint gives for this layer's cache: ``scales``
        holds ``"k"`` and ``"v"`` (float32, one value or one per KV head; FP8-KV checkpoints'
        ``self_attn.k_scale``/``v_scale``), or nothing when the checkpoint has none. Called
        by the engine once per layer after :meth:`init_layer`, before anything is stored;
        ``cache.layer`` is the attention layer. The default ignores them (a codec without
        scales, or one that calibrates its own)."""

    def calibrate(
        self, cache: LayerKVCache, q: "torch.Tensor", k: "torch.Tensor", v: "torch.Tensor"
    ) -> None:
        """Set the per-layer tensors of ``cache`` (offsets, scales, ...) from this layer's
        queries ``q`` [N, Hq, D] and keys and values ``k``/``v`` [N, Hkv, D] (float32, as the
        attention layer receives them) over the engine's calibration text. Called once per
        layer before anything is stored, for codecs that set :attr:`calibrated`;
        ``cache.layer`` is the attention layer."""

    def encode(
        self,
        cache: LayerKVCache,
        k: "torch.Tensor",
        v: "torch.Tensor",
        slot_mapping: "torch.Tensor",
    ) -> None:
        """Write ``k``/``v`` [T, Hkv, D] (the activations' dtype) into ``cache`` at
        ``slot_mapping`` [T] (slot = block * block_size + offset; -1 skips the row)."""
        raise NotImplementedError

    def decode(
        self, cache: LayerKVCache, blocks: "torch.Tensor"
    ) -> tuple["torch.Tensor", "torch.Tensor"]:
        """K and V [len(blocks) * block_size, Hkv, D] in float32, of the cache blocks
        ``blocks`` (int64 [n]) in order: what was encoded, up to the codec's rounding."""
        raise NotImplementedError

    def latent_dtype(self, model_dtype: "torch.dtype") -> "torch.dtype | None":
        """The dtype a latent (MLA) cache is kept in under this codec: one vector per token,
        each element cast (an 8-bit float saturates at its largest finite value), no scales.
        None: the codec cannot keep a latent cache (the default; a model with one is then
        refused at start-up, naming ``cache.kv_codec``)."""
        return None


@dataclass
class AttentionMetadata:
    """One step's flat batch, as attention backends see it.

    Sequences are laid end to end: sequence ``i`` owns query rows
    ``query_start_loc[i]:query_start_loc[i+1]``; those are its *last* tokens, so its context
    (earlier cached tokens plus this step's) has length ``seq_lens[i]``. K/V of row ``t`` go to
    cache slot ``slot_mapping[t]`` (block ``slot // block_size``, offset ``slot % block_size``);
    -1 marks a padding row whose K/V are not stored. Token ``j`` of sequence ``i`` lives in block
    ``block_tables[i, j // block_size]``.
    """

    num_seqs: int
    num_tokens: int
    query_start_loc: torch.Tensor  # int32 [B+1], device
    seq_lens: torch.Tensor  # int32 [B], device
    block_tables: torch.Tensor  # int32 [B, max_blocks], device
    slot_mapping: torch.Tensor  # int64 [T], device
    max_query_len: int
    max_seq_len: int
    block_size: int
    # Host copies, for backends (the torch reference) that loop in Python. None when the
    # metadata was built for a CUDA graph, where only device tensors exist.
    query_start_loc_cpu: list[int] | None = None
    seq_lens_cpu: list[int] | None = None
    #: True when this step is captured in, or replayed from, a CUDA graph of ``num_seqs``
    #: rows: the device tensors above are that graph's fixed buffers (see
    #: :meth:`tallow.plugin.AttentionBackend.plan`).
    cuda_graph: bool = False
    #: with several paged cache groups, each group's view of the step: the same rows and
    #: lengths with that group's ``block_tables`` and ``slot_mapping`` (view 0 is this
    #: metadata itself). Empty when the model has one paged group.
    group_views: list[AttentionMetadata] = field(default_factory=list, repr=False)
    #: per state group, the state slot of each sequence of the step (int64 [B], device)
    state_slots: list[torch.Tensor] = field(default_factory=list, repr=False)

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1

    def group(self, index: int) -> AttentionMetadata:
        """The view of paged cache group ``index`` (see :attr:`group_views`)."""
        return self.group_views[index] if self.group_views else self


@dataclass(frozen=True)
class AttentionLayer:
    """The fixed facts of one attention layer, as this tensor-parallel rank runs it.

    ``num_heads`` and ``num_kv_heads`` count the heads **of this rank** (see
    :class:`~tallow.layers.Attention`); ``head_dim`` is the size of one head. The KV cache of the layer is
    allocated from them: ``[2, blocks, block_size, num_kv_heads, head_dim]``.
    """

    layer_index: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    sliding_window: int | None = None  # attend to at most this many most recent tokens
    logit_softcap: float | None = None  # scores → softcap * tanh(scores / softcap)
    #: True: query ``j`` sees keys up to its own position (decoders). False: every query of a
    #: sequence sees all of its keys (encoders); the engine then computes each sequence whole
    #: in one step, so that all its keys exist when its queries attend.
    causal: bool = True
    #: attention sinks (gpt-oss): one learned logit per query head of this rank, float32
    #: ``[num_heads]``, that joins each query's softmax denominator and carries no value:
    #: ``p_j = exp(s_j) / (sum_k exp(s_k) + exp(sink_h))``. None: no sink. A backend that
    #: cannot add it refuses the layer (``supports_layer``). The tensor is the model's
    #: parameter (filled when the checkpoint loads); it takes no part in equality or hashing.
    sinks: "torch.Tensor | None" = field(default=None, compare=False, repr=False)
    #: chunked local attention (Llama 4): the positions are cut into chunks of this many
    #: tokens and a query sees only the keys of its own chunk (up to itself). None: no chunks.
    #: Only a backend with ``supports_chunked_attention`` is given such layers.
    attention_chunk_size: int | None = None
    #: KV sharing (Gemma 4's last layers): the index of the earlier layer whose K/V this layer
    #: attends to. Such a layer has no cache of its own and stores nothing: ``forward`` gets
    #: the source layer's cache and view of the step, and ``k``/``v`` are placeholders of the
    #: right shape (zero-strided, never written to the cache). None: the layer keeps its own
    #: K/V. Only a backend with ``supports_kv_sharing`` is given such layers.
    kv_shared_from: int | None = None


@dataclass(frozen=True)
class MLALayer:
    """The fixed facts of one multi-head latent attention (MLA) layer, as this
    tensor-parallel rank runs it (``num_heads``: this rank's query heads).

    Per token the layer caches one latent vector of ``kv_lora_rank + qk_rope_head_dim``
    elements shared by all heads: the compressed K/V ``c`` (after its RMSNorm) then the
    rotated key part ``k_pe``. Head ``h`` reads key ``[W_UK[h] c, k_pe]`` and value
    ``W_UV[h] c`` with the up-projections ``W_UK [H, qk_nope_head_dim, kv_lora_rank]`` and
    ``W_UV [H, v_head_dim, kv_lora_rank]``; its query is ``[q_nope, q_pe]``.
    """

    layer_index: int
    num_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    scale: float

    @property
    def latent_width(self) -> int:
        """Elements of one token's cache row."""
        return self.kv_lora_rank + self.qk_rope_head_dim


class LayerKVCache:
    """The KV cache of one attention layer: the tensors its codec lays out, by name.

    Paged tensors are ``[num_blocks, *block shape]``; a token at ``slot`` lives in block
    ``slot // block_size`` at offset ``slot % block_size``. ``cache["k"]`` is a tensor;
    :attr:`codec` says how to read it.
    """

    __slots__ = (
        "codec",
        "tensors",
        "layout",
        "num_kv_heads",
        "head_dim",
        "block_size",
        "num_blocks",
        "model_dtype",
        "layer",
    )

    def __init__(
        self,
        codec: KVCodec,
        tensors: dict[str, torch.Tensor],
        *,
        layout: Sequence[KVTensor],
        num_kv_heads: int,
        head_dim: int,
        block_size: int,
        model_dtype: torch.dtype,
        layer: AttentionLayer | None = None,
    ) -> None:
        self.codec = codec
        #: the attention layer (tallow.layers.AttentionLayer) the cache serves, when known
        self.layer = layer
        self.tensors = tensors
        self.layout = tuple(layout)
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_size = block_size
        self.model_dtype = model_dtype
        paged = [tensors[s.name] for s in self.layout if s.per_block]
        self.num_blocks = paged[0].shape[0]

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def get(self, name: str, default: torch.Tensor | None = None) -> torch.Tensor | None:
        return self.tensors.get(name, default)

    @property
    def device(self) -> torch.device:
        return next(iter(self.tensors.values())).device

    def paged(self) -> list[torch.Tensor]:
        """The per-block tensors, in layout order."""
        return [self.tensors[s.name] for s in self.layout if s.per_block]

    def clone(self) -> "LayerKVCache":
        """A copy with tensors of its own (for tests and references)."""
        return self.with_tensors({n: t.clone() for n, t in self.tensors.items()})

    def with_tensors(self, tensors: dict[str, torch.Tensor]) -> "LayerKVCache":
        """The same cache description over other tensors (copies, another device)."""
        return LayerKVCache(
            self.codec,
            tensors,
            layout=self.layout,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            block_size=self.block_size,
            model_dtype=self.model_dtype,
            layer=self.layer,
        )

    def __repr__(self) -> str:
        parts = ", ".join(
            f"{n}: {list(t.shape)} {str(t.dtype).removeprefix('torch.')}"
            for n, t in self.tensors.items()
        )
        return f"LayerKVCache({self.codec.name}; {parts})"


class AttentionBackend(Component):
    """Paged attention over one flat batch.

    ``forward(layer, q, k, v, kv_cache, meta)`` writes this step's ``k``/``v`` [T, Hkv, D] into
    ``kv_cache`` (a :class:`tallow.kernels.kv_cache.LayerKVCache`: the layer's cache tensors as
    its KV codec lays them out) at ``meta.slot_mapping`` and returns the attention output
    [T, Hq, D] for queries ``q`` [T, Hq, D], reading each sequence's earlier context through
    ``meta.block_tables``. ``layer`` carries the head counts, scale, sliding window and logit
    softcap (:class:`tallow.layers.attention.AttentionLayer`). A layer whose
    ``kv_shared_from`` is set reads another layer's cache and stores nothing (see
    :attr:`supports_kv_sharing`).
    """

    #: True if the decode path may be captured in a CUDA graph
    supports_cuda_graph: ClassVar[bool] = False
    #: the KV codecs (by name) whose storage this backend's own kernels write and read
    fused_kv_codecs: ClassVar[frozenset[str]] = frozenset({"auto"})
    #: True for a backend that serves any codec through the codec's torch reference
    #: (``encode``/``decode``), as the core's ``torch`` backend does
    uses_codec_reference: ClassVar[bool] = False
    #: True for a backend that implements :meth:`forward_mla` (latent attention layers)
    supports_mla: ClassVar[bool] = False
    #: True for a backend that runs KV-sharing layers (``layer.kv_shared_from`` set): it
    #: attends over the cache it is given and does not store that call's ``k``/``v``
    supports_kv_sharing: ClassVar[bool] = False
    #: True for a backend whose kernels mask chunked local attention (``layer.
    #: attention_chunk_size``: each query over the keys of its own chunk); the engine gives
    #: such layers to no other backend
    supports_chunked_attention: ClassVar[bool] = False

    def __init__(self, config: Any = None) -> None:
        """The engine builds each backend it considers with the configuration."""
        # Any: a tallow.config.TallowConfig or None, a layer above tallow.types
        self.config = config

    def supports_kv_codec(self, codec: KVCodec, layout: list[KVTensor]) -> list[str]:
        """Reasons this backend cannot store K/V as ``codec`` does with ``layout`` (one
        layer's tensors; empty when it can). The engine chooses the codec first and asks each
        candidate backend (an instance); a refusal passes an automatically chosen backend
        over for the next by priority. The default serves the codecs named in
        :attr:`fused_kv_codecs`, or every codec when :attr:`uses_codec_reference`."""
        if self.uses_codec_reference or codec.name in self.fused_kv_codecs:
            return []
        return [
            f"kv codec {codec.name!r} is not implemented by this backend (it implements "
            + ", ".join(sorted(self.fused_kv_codecs))
            + ")"
        ]

    def plan(self, meta: AttentionMetadata) -> None:
        """Prepare the step ``meta`` (:class:`tallow.layers.attention.AttentionMetadata`)
        describes, before any layer runs: work that depends on the batch but not on the layer
        (scheduling it over the GPU, page lists), done once per step so that :meth:`forward`
        only launches kernels. The engine calls it once per step, before the model's forward
        (:func:`tallow.layers.attention.forward_context` does), and before every replay of a
        CUDA graph. Then ``meta.cuda_graph`` is True, its device tensors are the graph's fixed
        buffers, already holding this step's values, and its host lists describe the padded
        batch (padding rows: length 1, slot -1); state that :meth:`forward` reads while the
        graph is captured must live in buffers fixed per ``meta.num_seqs``. The default does
        nothing. :meth:`forward` called with metadata that was not planned (tests, warm-ups)
        must still work, outside graph capture."""

    def forward(
        self,
        layer: AttentionLayer,
        q: "torch.Tensor",
        k: "torch.Tensor",
        v: "torch.Tensor",
        kv_cache: LayerKVCache,
        meta: AttentionMetadata,
    ) -> "torch.Tensor":
        raise NotImplementedError

    def forward_mla(
        self,
        layer: MLALayer,
        q_nope: "torch.Tensor",
        q_pe: "torch.Tensor",
        latent: "torch.Tensor",
        cache: "torch.Tensor",
        w_uk: "torch.Tensor",
        w_uv: "torch.Tensor",
        meta: AttentionMetadata,
    ) -> "torch.Tensor":
        """Multi-head latent attention of one layer (:class:`MLALayer`), for backends that
        set :attr:`supports_mla`: store this step's ``latent`` rows [T, latent_width] into
        ``cache`` ([num_blocks, block_size, latent_width], the latent cache group's tensor,
        in the codec's :meth:`KVCodec.latent_dtype`) at ``meta.slot_mapping`` (-1: not
        stored), then return the output [T, H, v_head_dim] for queries ``q_nope``
        [T, H, qk_nope_head_dim] and ``q_pe`` [T, H, qk_rope_head_dim] (already rotated)
        over each sequence's context, with the up-projections ``w_uk`` [H, qk_nope_head_dim,
        kv_lora_rank] and ``w_uv`` [H, v_head_dim, kv_lora_rank]. A backend may expand K/V
        (prefill) or absorb ``w_uk`` into the queries and ``w_uv`` into the output (decode:
        the latent is read once for all heads); both are the same attention
        (:func:`tallow.kernels.mla_attention_ref`). The rules of :meth:`forward` on CUDA
        graphs and :meth:`plan` apply."""
        raise NotImplementedError(
            f"attention backend {self.name!r} has no latent attention (MLA) path"
        )

    def warm_up(
        self, layers: list[AttentionLayer], kv_caches: list[LayerKVCache], dtype: "torch.dtype"
    ) -> None:
        """Prepare every kernel variant :meth:`forward` may launch for these ``layers``
        (:class:`tallow.layers.attention.AttentionLayer`), their caches (one per layer, as
        ``forward`` gets them) and activations of ``dtype``, so that no serving step compiles
        one. The engine calls it once on a GPU, after the caches are allocated and before
        CUDA graphs are captured. It must not write into ``kv_caches`` (they are only a
        description of shape, dtype and layout); a backend that compiles nothing on first use
        keeps this default, which does nothing."""


@dataclass
class HostBatch:
    """One step's flat batch on the host (:meth:`tallow.engine.batch_inputs.BatchInputs.fill_host`),
    before :meth:`~tallow.engine.batch_inputs.BatchInputs.upload` moves it to the device in two
    transfers.

    ``i64`` holds token ids, positions and cache slots (``num_tokens`` each), the rows to sample
    (``num_sampled``), then the fed rows and their sources (``num_seqs`` each, ``num_fed``
    used), then with several paged cache groups the slots of groups 1.. (``num_tokens`` each)
    and with state groups each one's state slots (``num_seqs`` each); ``i32`` holds the query
    offsets (``num_seqs + 1``), the sequence lengths (``num_seqs``) and the block tables
    (``num_seqs x width`` per paged group). A tensor-parallel driver sends exactly these to
    its workers, which upload them as they are."""

    i64: np.ndarray
    i32: np.ndarray
    num_seqs: int
    num_tokens: int
    num_sampled: int
    num_fed: int
    width: int
    max_query_len: int
    max_seq_len: int
    num_groups: int = 1
    num_state_groups: int = 0

    @property
    def query_start_loc(self) -> list[int]:
        return self.i32[: self.num_seqs + 1].tolist()

    @property
    def seq_lens(self) -> list[int]:
        return self.i32[self.num_seqs + 1 : 2 * self.num_seqs + 1].tolist()
