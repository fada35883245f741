"""The "triton" attention backend: paged attention on NVIDIA GPUs through Triton kernels.

Per layer and step, :meth:`TritonAttentionBackend.forward` stores this step's K/V at
``meta.slot_mapping`` and then

- decode-only steps (every sequence has one query): split-K decode (whose launch also stores
  the step's K/V when the context is split), capturable in a CUDA graph (no host reads of
  device data; the grid depends on ``meta.num_seqs`` and, outside capture, on the
  ``meta.max_seq_len`` hint only);
- other steps: the varlen prefill kernel for sequences with several queries and, when the batch
  may hold single-query sequences, split-K decode for those (so a long-context decode row in a
  mixed batch is still spread over the GPU).
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tallow.kernels import (
    LayerKVCache,
    capability,
    cuda_device_reasons,
    cuda_index,
    float8_reasons,
)
from tallow.layers import AttentionLayer, AttentionMetadata, MLALayer
from tallow.layers.attention_checks import check_rows, layer_reasons, qkv_shape_reasons
from tallow.plugin import AttentionBackend, KVCodec, KVTensor

from . import mla_ops, ops, turbo_ops
from .heuristics import MAX_SPLITS, block_size_reasons, head_dim_reasons, next_pow2
from .testing import make_case

#: lowest CUDA compute capability (major, minor): bf16 tensor-core products need Ampere
MIN_CAPABILITY = (8, 0)
DTYPES = {"auto", "float16", "bfloat16", "float32"}
TENSOR_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: cache dtypes the kernels read (widening to the activations' dtype) and write (rounding)
CACHE_DTYPES = TENSOR_DTYPES + (torch.float8_e4m3fn, torch.float8_e5m2)
#: the KV codecs the kernels implement: casts into one of CACHE_DTYPES, K and V paged alike
CAST_CODECS = frozenset({"auto", "fp8", "fp8_e5m2"})
#: and the turbo format of tallow-kvcache-turboquant (turbo_ops)
TURBO_CODECS = frozenset({"turbo8", "turbo4", "turbo3"})


def _split_counts_per_reduce_width() -> list[int]:
    """1 (no reduce), then the smallest split count of each width the reduce kernel is
    compiled for (``ops.reduce_spec``'s ``S_PAD``)."""
    firsts: dict[int, int] = {}
    for splits in range(2, MAX_SPLITS + 1):
        firsts.setdefault(max(16, next_pow2(splits)), splits)
    return [1] + sorted(firsts.values())


#: (query lengths, context lengths, padding rows, split count) of the warm-up batches: a
#: prompt-only step, prompts beside a decode, decode only with the store fused (one query row
#: per sequence) and not (a padding row), each split count that selects another variant
_WARM_UP_BATCHES = [([5, 3], [0, 4], 0, None)] + [
    batch
    for splits in _split_counts_per_reduce_width()
    for batch in (
        ([1, 4], [6, 2], 0, splits),
        ([1, 1], [7, 3], 0, splits),
        ([1, 1], [7, 3], 1, splits),
    )
]


def _cache_dtype_reasons(what: str, dtype: torch.dtype) -> list[str]:
    if dtype in CACHE_DTYPES:
        return []
    return [
        f"{what} {dtype} is not supported (expected one of "
        + ", ".join(str(d).removeprefix("torch.") for d in CACHE_DTYPES)
        + ")"
    ]


def _paged_reasons(
    kv_cache: LayerKVCache, num_kv_heads: int, head_dim: int, block_size: int
) -> list[str]:
    """Why the kernels cannot index the paged tensors of ``kv_cache`` as they are (shapes,
    strides, block size)."""
    turbo = turbo_ops.is_turbo(kv_cache)
    k_name, v_name = ("k_codes", "v_codes") if turbo else ("k", "v")
    k_cache, v_cache = kv_cache.get(k_name), kv_cache.get(v_name)
    width = k_cache.shape[-1] if turbo and k_cache is not None else head_dim
    if (
        k_cache is None
        or v_cache is None
        or k_cache.dim() != 4
        or tuple(k_cache.shape[2:]) != (num_kv_heads, width)
    ):
        return [
            f"kv_cache must hold {k_name} and {v_name} of [blocks, block_size, "
            f"{num_kv_heads}, {width}], got {kv_cache!r}"
        ]
    if k_cache.shape != v_cache.shape or k_cache.stride() != v_cache.stride():
        return [f"kv_cache {k_name} and {v_name} must have the same shape and strides"]
    if k_cache.stride(-1) != 1:
        return ["kv_cache must be contiguous in its last dimension"]
    reasons = block_size_reasons(k_cache.shape[1])
    if k_cache.shape[1] != block_size:
        reasons.append(
            f"kv_cache block size {k_cache.shape[1]} differs from meta.block_size {block_size}"
        )
    if turbo:
        k_scales, v_scales = kv_cache["k_scales"], kv_cache["v_scales"]
        if k_scales.stride() != v_scales.stride() or k_scales.stride(-1) != 1:
            reasons.append(
                "kv_cache k_scales and v_scales must have the same strides, contiguous per head"
            )
        for name in turbo_ops.PER_LAYER:
            if name in kv_cache and not kv_cache[name].is_contiguous():
                reasons.append(f"kv_cache {name} must be contiguous")
    return reasons


def _cast_layout_reasons(layout: list[KVTensor]) -> list[str]:
    """Why the kernels cannot read a cache of ``layout`` as K and V cast elementwise (with,
    optionally, a float32 scale per KV head for each, ``k_scale`` and ``v_scale``, and a
    float32 key offset per head, ``k_offset`` [Hkv, D])."""
    by_name = {spec.name: spec for spec in layout}
    k, v = by_name.get("k"), by_name.get("v")
    names = set(by_name)
    scaled = {"k_scale", "v_scale"} <= names
    extra = names - {"k", "v"} - ({"k_scale", "v_scale"} if scaled else set()) - {"k_offset"}

    def per_layer(name: str, shape: tuple[int, ...]) -> bool:
        spec = by_name[name]
        return not spec.per_block and spec.dtype == torch.float32 and tuple(spec.shape) == shape

    if (
        extra
        or k is None
        or v is None
        or not (k.per_block and v.per_block)
        or k.shape != v.shape
        or k.dtype != v.dtype
        or len(k.shape) != 3
        or (
            scaled
            and not (per_layer("k_scale", (k.shape[1],)) and per_layer("v_scale", (k.shape[1],)))
        )
        or ("k_offset" in names and not per_layer("k_offset", tuple(k.shape[1:])))
    ):
        return [
            "its cache layout is not paged k and v tensors of [block_size, Hkv, D] in one "
            "dtype, with or without float32 k_scale and v_scale of [Hkv] and k_offset of "
            "[Hkv, D] (" + ", ".join(f"{s.name} {list(s.shape)} {s.dtype}" for s in layout) + ")"
        ]
    return _cache_dtype_reasons("cache dtype", k.dtype)


def _get(obj: Any, *path: str, default: Any = None) -> Any:
    for name in path:
        if obj is None:
            return default
        obj = getattr(obj, name, None)
    return default if obj is None else obj


class TritonAttentionBackend(AttentionBackend):
    """Paged attention through the Triton kernels of :mod:`tallow_attention_triton.ops`.

    Serves fp16, bf16 and fp32 models on CUDA devices of compute capability 8.0 or newer, with
    the KV codecs its kernels implement (``auto``: K/V cached in the model's dtype; ``fp8`` and
    ``fp8_e5m2`` of tallow-kvcache-fp8, with or without per-head scales and centred keys;
    ``turbo8``, ``turbo4`` and ``turbo3`` of tallow-kvcache-turboquant), head sizes that are
    multiples of 16 up to 512 (up to 256 over a turbo cache) and power-of-two block sizes up
    to 256.
    """

    name: ClassVar[str] = "triton"
    supports_cuda_graph: ClassVar[bool] = True
    fused_kv_codecs: ClassVar[frozenset[str]] = CAST_CODECS | TURBO_CODECS
    #: reads each layer's own cache group view of a step (sliding-window groups whose blocks
    #: are freed, beside full ones): every call takes its block tables from the metadata given
    supports_cache_groups: ClassVar[bool] = True
    #: latent attention (MLA): split-K decode with the up-projections absorbed
    #: (:mod:`tallow_attention_triton.mla_ops`)
    supports_mla: ClassVar[bool] = True
    #: KV-sharing layers (``layer.kv_shared_from``): attention over the source layer's cache,
    #: no store
    supports_kv_sharing: ClassVar[bool] = True
    #: chunked local attention (``layer.attention_chunk_size``): the kernels start each
    #: query's keys at its chunk (``kernels.common.first_visible_key``)
    supports_chunked_attention: ClassVar[bool] = True

    def __init__(self, config: Any = None) -> None:
        self.config = config
        settings = _get(config, "plugins", "settings", default={}) or {}
        own = settings.get("tallow-attention-triton", {}) if isinstance(settings, dict) else {}
        #: fixed split count for decode (None: chosen per batch by the heuristics)
        self.num_splits: int | None = own.get("num_splits")
        if self.num_splits is not None and (
            not isinstance(self.num_splits, int) or self.num_splits < 1
        ):
            raise ValueError(
                "plugins.settings.tallow-attention-triton.num_splits must be a "
                f"positive integer, got {self.num_splits!r}"
            )
        self._checked: set[tuple[Any, ...]] = set()

    # -- selection ------------------------------------------------------------------------
    @classmethod
    def validate(cls, config: Any) -> list[str]:
        """Reasons this backend cannot serve ``config`` (a TallowConfig, or None)."""
        reasons: list[str] = []
        device = str(_get(config, "model", "device", default="auto"))
        dtype = str(_get(config, "model", "dtype", default="auto"))
        block_size = _get(config, "cache", "block_size", default=16)
        if dtype not in DTYPES:
            reasons.append(
                f"model.dtype {dtype!r} is not supported (expected one of "
                f"{', '.join(sorted(DTYPES))})"
            )
        reasons += block_size_reasons(block_size)
        if device == "cpu":
            reasons.append("model.device is 'cpu' (the triton backend needs a CUDA device)")
            return reasons
        try:
            import triton  # noqa: F401
        except Exception as exc:  # pragma: no cover - triton ships with the core
            reasons.append(f"triton cannot be imported: {type(exc).__name__}: {exc}")
            return reasons
        return reasons + cuda_device_reasons(device, MIN_CAPABILITY)[0]

    def supports_kv_codec(self, codec: KVCodec, layout: list[KVTensor]) -> list[str]:
        """Reasons the kernels cannot keep K/V as ``codec`` does: they implement the codecs of
        :attr:`fused_kv_codecs`, casts into one of :data:`CACHE_DTYPES` laid out as paged
        ``k`` and ``v`` tensors and the turbo format (:func:`turbo_ops.layout_reasons`)."""
        reasons = super().supports_kv_codec(codec, layout)
        if reasons:
            return reasons
        if codec.name in TURBO_CODECS:
            return turbo_ops.layout_reasons(layout)
        return _cast_layout_reasons(layout) + [
            reason for spec in layout for reason in self._float8_reasons(spec.dtype)
        ]

    def _float8_reasons(self, dtype: torch.dtype) -> list[str]:
        device = str(_get(self.config, "model", "device", default="auto"))
        if device == "cpu" or not torch.cuda.is_available():
            return []
        reasons = float8_reasons(dtype, capability(cuda_index(device)))
        if reasons and dtype == torch.float8_e4m3fn:
            reasons = [reasons[0] + ": use kv codec fp8_e5m2, or runner.attention_backend: torch"]
        return reasons

    @staticmethod
    def supports_layer(layer: AttentionLayer) -> list[str]:
        """Reasons this backend cannot run ``layer`` (empty when it can). The model runner
        may call it once per layer after building the model; ``forward`` enforces it too."""
        chunks = TritonAttentionBackend.supports_chunked_attention
        return head_dim_reasons(layer.head_dim) + layer_reasons(layer, chunks=chunks)

    # -- the step -------------------------------------------------------------------------
    def _check(
        self,
        layer: AttentionLayer,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: LayerKVCache,
        meta: AttentionMetadata,
    ) -> None:
        check_rows("triton", layer, q, k, v, meta)
        key = (
            layer,
            q.dtype,
            k.dtype,
            v.dtype,
            q.device,
            tuple(q.shape[1:]),
            tuple(k.shape[1:]),
            tuple(v.shape[1:]),
            meta.block_size,
            kv_cache.codec.name,
            tuple(
                (name, t.dtype, tuple(t.shape[1:]), t.stride())
                for name, t in kv_cache.tensors.items()
            ),
        )
        if key in self._checked:
            return
        reasons = self.supports_layer(layer) + qkv_shape_reasons(layer, q, k, v)
        hkv, d = layer.num_kv_heads, layer.head_dim
        reasons += self.supports_kv_codec(kv_cache.codec, list(kv_cache.layout))
        reasons += _paged_reasons(kv_cache, hkv, d, meta.block_size)
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.dtype not in TENSOR_DTYPES:
                reasons.append(
                    f"{name} dtype {t.dtype} is not supported (expected float16, "
                    "bfloat16 or float32)"
                )
        if q.device.type != "cuda" and not ops.interpreting():
            reasons.append(f"tensors are on {q.device}; the triton backend needs CUDA tensors")
        if reasons:
            raise ValueError(f"triton attention, layer {layer.layer_index}: " + "; ".join(reasons))
        self._checked.add(key)

    def warm_up(
        self, layers: list[AttentionLayer], kv_caches: list[LayerKVCache], dtype: torch.dtype
    ) -> None:
        """Launch every kernel variant once on tiny batches of each distinct layer shape:
        Triton compiles a variant on its first launch (seconds each; cached on disk for later
        processes), and the engine's warm-up steps, with their short prompts, reach neither
        split contexts beside prompts nor most reduce widths.

        Per shape: a prompt-only step; prompts beside a decode and decode-only steps with one
        split and with a split count for each width of the reduce (up to ``MAX_SPLITS``);
        decode-only with the store fused into the split launch and, with a padding row, not.
        The batches use caches of their own, of the same codec as ``kv_caches``."""
        done: set[tuple[Any, ...]] = set()
        saved = self.num_splits
        try:
            for layer, cache in zip(layers, kv_caches):
                key = (
                    layer.num_heads,
                    layer.num_kv_heads,
                    layer.head_dim,
                    bool(layer.sliding_window),
                    bool(layer.attention_chunk_size),
                    bool(layer.logit_softcap),
                    layer.causal,
                    layer.sinks is not None,
                    cache.codec.name,
                    tuple((name, t.dtype) for name, t in cache.tensors.items()),
                    cache.block_size,
                )
                if key in done:
                    continue
                done.add(key)
                for query_lens, context_lens, padding, splits in _WARM_UP_BATCHES:
                    if not layer.causal:  # encoder sequences are always computed whole
                        context_lens = [0] * len(context_lens)
                    case = make_case(
                        query_lens=query_lens,
                        context_lens=context_lens,
                        num_heads=layer.num_heads,
                        num_kv_heads=layer.num_kv_heads,
                        head_dim=layer.head_dim,
                        block_size=cache.block_size,
                        dtype=dtype,
                        codec=cache.codec,
                        device=cache.device,
                        sliding_window=layer.sliding_window,
                        attention_chunk_size=layer.attention_chunk_size,
                        logit_softcap=layer.logit_softcap,
                        scale=layer.scale,
                        padding_rows=padding,
                        causal=layer.causal,
                        sinks=layer.sinks,
                    )
                    self.num_splits = splits
                    self.forward(case.layer, case.q, case.k, case.v, case.kv_cache, case.meta)
        finally:
            self.num_splits = saved

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
    ) -> torch.Tensor:
        """Store the step's latent rows; single-query sequences through the absorbed split-K
        kernel, sequences with several queries through the core's reference (expanded K/V)."""
        key = ("mla", layer, q_nope.dtype, q_nope.device, cache.dtype, tuple(cache.shape[1:]))
        if key not in self._checked:
            reasons = mla_ops.mla_reasons(layer, cache, q_nope)
            if reasons:
                raise ValueError(
                    f"triton attention, MLA layer {layer.layer_index}: " + "; ".join(reasons)
                )
            self._checked.add(key)
        return mla_ops.forward_mla(
            layer, q_nope, q_pe, latent, cache, w_uk, w_uv, meta, num_splits=self.num_splits
        )

    def forward(
        self,
        layer: AttentionLayer,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: LayerKVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Store ``k``/``v`` at ``meta.slot_mapping``, return attention [T, Hq, D] for ``q``.

        Rows past ``query_start_loc[num_seqs]`` (padding) are left unwritten.
        """
        self._check(layer, q, k, v, kv_cache, meta)
        # a KV-sharing layer reads its source layer's cache: its k/v are placeholders
        store = layer.kv_shared_from is None
        turbo = turbo_ops.is_turbo(kv_cache)
        scaled = "k_scale" in kv_cache
        # centred keys are read as stored: a query's scores all move by q . offset, which the
        # softmax cancels (the codec leaves the offset zero under a logit softcap)
        transformed = scaled or "k_offset" in kv_cache
        if turbo:
            # the queries in the stored keys' coordinates, once for the step
            q = turbo_ops.rotate_queries(q, kv_cache)
        elif scaled:
            # keys stored divided by their head's scale: the queries carry it instead
            q = ops.scale_queries(q, kv_cache)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        common = dict(
            query_start_loc=meta.query_start_loc,
            seq_lens=meta.seq_lens,
            block_tables=meta.block_tables,
            num_seqs=meta.num_seqs,
            scale=layer.scale,
            sliding_window=layer.sliding_window,
            attention_chunk_size=layer.attention_chunk_size,
            logit_softcap=layer.logit_softcap,
            num_splits=self.num_splits,
            max_seq_len=meta.max_seq_len,
            sinks=layer.sinks,
        )
        if meta.is_decode_only:
            splits = common["num_splits"] or ops.choose_num_splits(
                q, kv_cache, meta.num_seqs, meta.max_seq_len
            )
            common["num_splits"] = splits
            if not store:
                ops.decode_attention(q, kv_cache, out, **common)
            elif splits > 1 and q.shape[0] == meta.num_seqs and not (turbo or transformed):
                # Small batches are launch-latency bound: the store rides in the attention
                # launch. With one split (large batches, bandwidth bound) the fused variant's
                # extra registers cost occupancy, so the store launches on its own.
                return ops.decode_attention(
                    q, kv_cache, out, k=k, v=v, slot_mapping=meta.slot_mapping, **common
                )
            else:
                ops.store_kv(kv_cache, k, v, meta.slot_mapping)
                ops.decode_attention(q, kv_cache, out, **common)
        else:
            if store:
                ops.store_kv(kv_cache, k, v, meta.slot_mapping)
            qsl = meta.query_start_loc_cpu
            singles = True if qsl is None else any(b - a == 1 for a, b in zip(qsl, qsl[1:]))
            prefill_args = {
                name: val
                for name, val in common.items()
                if name not in ("num_splits", "max_seq_len")
            }
            # A one-query sequence goes to the decode kernel either way: in a bidirectional
            # layer it is a whole one-token sequence, whose query sees its one key in both
            # kernels.
            ops.prefill_attention(
                q, kv_cache, out, skip_single_query=singles, causal=layer.causal, **prefill_args
            )
            if singles:
                ops.decode_attention(q, kv_cache, out, mixed=True, **common)
        # a turbo cache's output is a mix of rotated values: rotated back once; a scaled
        # cast cache's, of values divided by their head's scale: multiplied back once
        if turbo:
            return turbo_ops.restore_output(out, kv_cache)
        return ops.scale_output(out, kv_cache) if scaled else out
