"""The "flashinfer" attention backend: paged attention through FlashInfer's kernels.

Per step, :meth:`FlashInferAttentionBackend.plan` (called by the engine before the layers run,
or on the first layer when nobody did) turns the step's metadata into FlashInfer's page
arguments once; each layer kind (:mod:`.kinds`) is planned on its first layer; every layer
then stores its K/V at ``meta.slot_mapping`` (:func:`tallow.kernels.store_cast_kv`, the cast
codecs' store, which also casts to an 8-bit cache) and runs the planned wrapper over the
layer's ``k`` and ``v`` page tensors:

- decode-only steps: FlashInfer's decode (CUDA cores) or its FA2 kernels with one query row per
  sequence (tensor cores), chosen per kind; under a CUDA graph through the wrapper's graph mode,
  with page buffers fixed per captured batch size and re-planned before each replay;
- other steps (prompts, chunks of prompts beside decodes, prefix hits): FlashInfer's paged
  prefill kernels, FA3 on Hopper for 16-bit caches, FA2 otherwise.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from tallow.kernels import LayerKVCache, allocate_layer, store_cast_kv
from tallow.layers import AttentionLayer, AttentionMetadata
from tallow.layers.attention_checks import check_rows, layer_reasons, qkv_shape_reasons
from tallow.plugin import AttentionBackend, KVCodec, KVTensor, PluginSettingsError

from .availability import device_reasons, get, import_reasons, nvcc_reasons, package_reasons
from .kinds import ACTIVATION_DTYPES, CACHE_DTYPES, FP8_DTYPES, HEAD_DIMS, LayerKind, jit_specs
from .paging import host_page_args, page_list
from .planner import KindPlans, Planned, StepBatch
from .settings import DISTRIBUTION, FlashInferSettings, read_settings

log = logging.getLogger("tallow.attention.flashinfer")

DTYPES = {"auto", "float16", "bfloat16"}
#: the KV codecs whose cache FlashInfer's kernels read: plain casts into the model's dtype
#: (tallow's ``auto``) or an 8-bit float (tallow-kvcache-fp8's ``fp8`` and ``fp8_e5m2``)
CAST_CODECS = frozenset({"auto", "fp8", "fp8_e5m2"})
#: per-layer tensors of a cast codec that FlashInfer cannot apply: it takes at most one scalar
#: scale for all K (and one for all V), not one per head, and no key offset
_UNREAD_TENSORS = {
    "k_scale": "per-head K/V scales (FlashInfer takes at most one scalar scale for all heads)",
    "v_scale": "per-head K/V scales (FlashInfer takes at most one scalar scale for all heads)",
    "k_offset": "centred keys (FlashInfer's kernels take no key offset)",
}


def _names(dtypes: tuple[torch.dtype, ...]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


@dataclass
class _Step:
    """The step being run: its metadata, its page arguments (built on first need) and the
    plan of each layer kind met so far."""

    meta: AttentionMetadata
    batch: StepBatch | None = None
    plans: dict[LayerKind, Planned] = field(default_factory=dict)


class FlashInferAttentionBackend(AttentionBackend):
    """Paged attention through FlashInfer (``flashinfer-python``).

    Serves float16 and bfloat16 models on CUDA devices of compute capability 8.0 or newer with
    head sizes 64, 128 and 256, any grouped-query ratio, sliding windows, logit softcap,
    bidirectional (encoder) layers, and the KV codecs that cast into a cache of the model's
    dtype or an 8-bit float (``auto``; ``fp8``, ``fp8_e5m2`` of tallow-kvcache-fp8) without
    per-head scales or centred keys.
    """

    name: ClassVar[str] = "flashinfer"
    supports_cuda_graph: ClassVar[bool] = True
    fused_kv_codecs: ClassVar[frozenset[str]] = CAST_CODECS

    def __init__(self, config: Any = None) -> None:
        self.config = config
        self.settings: FlashInferSettings = read_settings(config)
        #: the layer kinds of the model (from warm_up): planned up front for CUDA graphs
        self.kinds: set[LayerKind] = set()
        self._plans: dict[LayerKind, KindPlans] = {}
        self._workspaces: dict[torch.device, torch.Tensor] = {}
        self._step: _Step | None = None
        #: inputs already checked (by their shapes and dtypes) -> their layer kind
        self._checked: dict[tuple[Any, ...], LayerKind] = {}

    # -- selection ------------------------------------------------------------------------
    @classmethod
    def validate(cls, config: Any) -> list[str]:
        """Reasons this backend cannot serve ``config`` (a TallowConfig, or None)."""
        reasons: list[str] = []
        try:
            settings = read_settings(config)
        except PluginSettingsError as exc:
            reasons.append(str(exc))
            settings = FlashInferSettings()
        dtype = str(get(config, "model", "dtype", default="auto"))
        if dtype not in DTYPES:
            reasons.append(
                f"model.dtype {dtype!r} is not supported (FlashInfer's kernels take "
                "float16 or bfloat16 activations; expected auto, bfloat16 or "
                "float16)"
            )
        reasons += package_reasons()
        device = str(get(config, "model", "device", default="auto"))
        if device == "cpu":
            reasons.append("model.device is 'cpu' (FlashInfer's kernels need a CUDA device)")
            return reasons
        found, capability = device_reasons(device)
        reasons += found
        if capability is not None and settings.prefill_backend == "fa3" and capability[0] != 9:
            reasons.append(
                f"plugins.settings.{DISTRIBUTION}.prefill_backend 'fa3' needs a "
                "Hopper GPU (compute capability 9.x), this one is "
                f"{capability[0]}.{capability[1]}"
            )
        if not reasons:  # only where it could run: finding nvcc and importing cost time
            reasons += nvcc_reasons() + import_reasons()
        return reasons

    @staticmethod
    def supports_layer(layer: AttentionLayer) -> list[str]:
        """Reasons this backend cannot run ``layer`` (empty when it can)."""
        reasons = []
        if layer.head_dim not in HEAD_DIMS:
            reasons.append(
                f"head size {layer.head_dim} is not one FlashInfer's kernels are "
                f"built for here ({', '.join(map(str, HEAD_DIMS))})"
            )
        if layer.sinks is not None:
            reasons.append(
                "attention sinks (gpt-oss: a learned logit per head in the softmax "
                "denominator) are not added by the FlashInfer kernels used here; "
                "use runner.attention_backend: triton"
            )
        return reasons + layer_reasons(layer)

    def supports_kv_codec(self, codec: KVCodec, layout: list[KVTensor]) -> list[str]:
        """Reasons FlashInfer cannot read K/V kept as ``codec`` does with ``layout``: it reads
        the codecs of :attr:`fused_kv_codecs` laid out as paged ``k`` and ``v`` tensors of
        ``[block_size, Hkv, D]`` in one of float16, bfloat16 or an 8-bit float, with no
        per-layer tensors (no per-head scales, no key offsets)."""
        reasons = super().supports_kv_codec(codec, layout)
        if reasons:
            return reasons
        paged = {spec.name: spec for spec in layout if spec.per_block}
        if sorted(paged) != ["k", "v"]:
            return [
                f"kv codec {codec.name!r} lays out paged tensors {sorted(paged)}; "
                "FlashInfer reads exactly a paged 'k' and 'v'"
            ]
        k, v = paged["k"], paged["v"]
        if len(k.shape) != 3 or k.shape != v.shape or k.dtype != v.dtype:
            reasons.append(
                f"kv codec {codec.name!r}: FlashInfer reads 'k' and 'v' pages of one "
                "shape [block_size, Hkv, D] and one dtype, got "
                f"{list(k.shape)} {k.dtype} and {list(v.shape)} {v.dtype}"
            )
        elif k.dtype not in CACHE_DTYPES:
            reasons.append(
                f"kv codec {codec.name!r}: cache dtype {k.dtype} is not supported "
                f"(FlashInfer's kernels read {_names(CACHE_DTYPES)})"
            )
        elif k.dtype in FP8_DTYPES and self.settings.prefill_backend == "fa3":
            reasons.append(
                f"plugins.settings.{DISTRIBUTION}.prefill_backend 'fa3': FA3 reads "
                "an 8-bit cache only with 8-bit queries (use auto or fa2)"
            )
        unread = {
            _UNREAD_TENSORS.get(spec.name, f"per-layer tensor {spec.name!r}")
            for spec in layout
            if not spec.per_block
        }
        for what in sorted(unread):
            reasons.append(
                f"kv codec {codec.name!r} stores {what}; use the codec without "
                "them, or runner.attention_backend: triton"
            )
        return reasons

    # -- planning -------------------------------------------------------------------------
    def plan(self, meta: AttentionMetadata) -> None:
        """Start step ``meta``. For a CUDA graph, every layer kind the warm-up saw is planned
        now, outside the capture (into the graph wrappers of ``meta.num_seqs`` rows); otherwise
        each kind is planned at its first layer."""
        step = self._step = _Step(meta)
        if meta.cuda_graph:
            if not self.kinds:
                raise RuntimeError(
                    "flashinfer attention: warm_up(layers, kv_caches, dtype) must "
                    "run before CUDA graphs are captured (it names the layer "
                    "kinds to plan for)"
                )
            for kind in self.kinds:
                step.plans[kind] = self._kind_plans(kind, meta.block_tables.device).plan(
                    self._batch(step)
                )

    def _batch(self, step: _Step) -> StepBatch:
        if step.batch is None:
            meta = step.meta
            n = meta.num_seqs
            qsl = meta.query_start_loc_cpu
            lens = meta.seq_lens_cpu
            args = host_page_args(
                qsl if qsl is not None else meta.query_start_loc.tolist(),
                lens if lens is not None else meta.seq_lens[:n].tolist(),
                meta.block_size,
            )
            indices = page_list(meta.seq_lens[:n], meta.block_tables[:n], meta.block_size)
            step.batch = StepBatch(
                args,
                indices,
                meta.block_size,
                meta.is_decode_only,
                meta.cuda_graph,
                meta.block_tables.shape[1],
            )
        return step.batch

    def _kind_plans(self, kind: LayerKind, device: torch.device) -> KindPlans:
        plans = self._plans.get(kind)
        if plans is None:
            workspace = self._workspaces.get(device)
            if workspace is None:
                workspace = self._workspaces[device] = torch.zeros(
                    self.settings.workspace_mb << 20, dtype=torch.uint8, device=device
                )
            plans = self._plans[kind] = KindPlans(
                kind,
                workspace,
                prefill_backend=self.settings.prefill_backend,
                decode_tensor_cores=self.settings.decode_tensor_cores,
                capability=(
                    tuple(torch.cuda.get_device_capability(device))
                    if device.type == "cuda"
                    else (0, 0)
                ),
            )
        return plans

    def _planned(self, meta: AttentionMetadata, kind: LayerKind) -> Planned:
        capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
        step = self._step
        if step is None or step.meta is not meta:
            if capturing:
                raise RuntimeError(
                    "flashinfer attention: a CUDA graph is being captured for a "
                    "step that was not planned: call plan(meta) before capturing"
                )
            self.plan(meta)
            step = self._step
            assert step is not None
        planned = step.plans.get(kind)
        if planned is None:
            if capturing:
                raise RuntimeError(
                    f"flashinfer attention: layer kind {kind} was not planned "
                    "before the CUDA graph capture: warm_up must see every layer"
                )
            planned = step.plans[kind] = self._kind_plans(kind, meta.block_tables.device).plan(
                self._batch(step)
            )
        return planned

    # -- the step -------------------------------------------------------------------------
    def _check(
        self,
        layer: AttentionLayer,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: LayerKVCache,
        meta: AttentionMetadata,
    ) -> LayerKind:
        """Raise ValueError naming what does not fit; return the layer's kind."""
        check_rows("flashinfer", layer, q, k, v, meta)
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
                (name, t.dtype, t.device, tuple(t.shape[1:]), t.is_contiguous())
                for name, t in kv_cache.tensors.items()
            ),
        )
        kind = self._checked.get(key)
        if kind is not None:
            return kind
        reasons = self.supports_layer(layer)
        hkv, d = layer.num_kv_heads, layer.head_dim
        reasons += qkv_shape_reasons(layer, q, k, v, contiguous_heads=True)
        if q.dtype not in ACTIVATION_DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
            reasons.append(
                f"q, k and v must all be one of {_names(ACTIVATION_DTYPES)}, got "
                f"{q.dtype}, {k.dtype}, {v.dtype}"
            )
        codec_reasons = self.supports_kv_codec(kv_cache.codec, list(kv_cache.layout))
        reasons += codec_reasons
        if not codec_reasons:
            reasons += _page_reasons(kv_cache, q.dtype, hkv, d, meta.block_size)
            if q.device.type != "cuda" or kv_cache.device != q.device:
                reasons.append(
                    f"tensors must be on one CUDA device, got q on {q.device} and "
                    f"the cache on {kv_cache.device}"
                )
        if reasons:
            raise ValueError(
                f"flashinfer attention, layer {layer.layer_index}: " + "; ".join(reasons)
            )
        kind = self._checked[key] = LayerKind.of(layer, q.dtype, kv_cache["k"].dtype)
        return kind

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

        Rows past ``query_start_loc[num_seqs]`` (padding) are left unwritten."""
        kind = self._check(layer, q, k, v, kv_cache, meta)
        pages = (kv_cache["k"], kv_cache["v"])
        store_cast_kv(*pages, k, v, meta.slot_mapping)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        self._planned(meta, kind).run(q, pages, out)
        return out

    # -- warm-up --------------------------------------------------------------------------
    def warm_up(
        self, layers: list[AttentionLayer], kv_caches: list[LayerKVCache], dtype: torch.dtype
    ) -> None:
        """Learn the model's layer kinds (CUDA graphs plan them before capture), compile the
        FlashInfer modules they need in parallel (one nvcc build each, just in time; a module
        compiled before, or shipped ahead of time, is only loaded), then run a step with
        prompts and a decode-only step per kind on caches of their own, so that no serving step
        compiles or loads a module."""
        kinds: dict[LayerKind, LayerKVCache] = {}
        for layer, cache in zip(layers, kv_caches):
            kinds.setdefault(LayerKind.of(layer, dtype, cache["k"].dtype), cache)
        self.kinds.update(kinds)
        started = time.perf_counter()
        specs = {}
        for kind, cache in kinds.items():
            plans = self._kind_plans(kind, cache.device)
            for spec in jit_specs(kind, plans.prefill_backend, plans.tensor_core_decode):
                specs.setdefault(spec.name, spec)
        to_build = [spec for spec in specs.values() if not spec.is_aot]
        if to_build:
            with ThreadPoolExecutor(max_workers=len(to_build)) as pool:
                list(pool.map(lambda spec: spec.build(verbose=False), to_build))
        log.info(
            "flashinfer: %d module(s) ready (%d checked or compiled) in %.1fs",
            len(specs),
            len(to_build),
            time.perf_counter() - started,
        )
        for kind, cache in kinds.items():
            for query_lens, context_lens in (([3, 1], [2, 4]), ([1, 1], [5, 0])):
                if not kind.causal:
                    context_lens = [0, 0]
                self.forward(*_tiny_step(kind, cache, query_lens, context_lens))
        torch.cuda.synchronize()
        self._step = None


def _page_reasons(
    kv_cache: LayerKVCache, q_dtype: torch.dtype, hkv: int, d: int, block_size: int
) -> list[str]:
    """What does not fit in ``kv_cache``'s ``k``/``v`` pages for a layer of ``hkv`` KV heads
    of ``d`` elements, ``q_dtype`` queries and blocks of ``block_size`` tokens."""
    reasons = []
    for name in ("k", "v"):
        t = kv_cache[name]
        if t.dim() != 4 or tuple(t.shape[2:]) != (hkv, d):
            reasons.append(
                f"kv_cache[{name!r}] must be [blocks, block_size, {hkv}, {d}], got {list(t.shape)}"
            )
        elif not t.is_contiguous():
            reasons.append(f"kv_cache[{name!r}] must be contiguous")
        elif t.shape[1] != block_size:
            reasons.append(
                f"kv_cache[{name!r}] block size {t.shape[1]} differs from "
                f"meta.block_size {block_size}"
            )
    dtype = kv_cache["k"].dtype
    if dtype not in FP8_DTYPES and dtype != q_dtype:
        reasons.append(
            f"kv_cache dtype {dtype} must be q's ({q_dtype}) or an 8-bit float "
            f"({_names(FP8_DTYPES)})"
        )
    return reasons


def _tiny_step(
    kind: LayerKind, like: LayerKVCache, query_lens: list[int], context_lens: list[int]
) -> tuple[Any, ...]:
    """(layer, q, k, v, kv_cache, meta) of a small step of ``kind`` on a zeroed cache of its
    own, of ``like``'s codec and block size: sequence i has ``context_lens[i]`` cached tokens
    and ``query_lens[i]`` new ones."""
    block_size, device = like.block_size, like.device
    layer = AttentionLayer(
        layer_index=-1,
        num_heads=kind.num_heads,
        num_kv_heads=kind.num_kv_heads,
        head_dim=kind.head_dim,
        scale=kind.scale,
        sliding_window=kind.window_left + 1 if kind.window_left >= 0 else None,
        logit_softcap=kind.softcap or None,
        causal=kind.causal,
    )
    seq_lens = [c + n for c, n in zip(context_lens, query_lens)]
    pages = [-(-s // block_size) for s in seq_lens]
    width = max(pages)
    tables = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    at = 0
    slots = []
    for i, (ctx, n) in enumerate(zip(context_lens, query_lens)):
        tables[i, : pages[i]] = torch.arange(at, at + pages[i], dtype=torch.int32)
        at += pages[i]
        slots += [
            int(tables[i, p // block_size]) * block_size + p % block_size
            for p in range(ctx, ctx + n)
        ]
    rows = sum(query_lens)
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    cache = allocate_layer(
        like.codec,
        num_kv_heads=kind.num_kv_heads,
        head_dim=kind.head_dim,
        block_size=block_size,
        num_blocks=at,
        model_dtype=kind.q_dtype,
        device=device,
        layer=layer,
    )
    q = torch.zeros(rows, kind.num_heads, kind.head_dim, dtype=kind.q_dtype, device=device)
    k = torch.zeros(rows, kind.num_kv_heads, kind.head_dim, dtype=kind.q_dtype, device=device)
    meta = AttentionMetadata(
        num_seqs=len(seq_lens),
        num_tokens=rows,
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=tables.to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        block_size=block_size,
        query_start_loc_cpu=starts,
        seq_lens_cpu=seq_lens,
    )
    return layer, q, k, k.clone(), cache, meta
