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

from tallow.kernels.kv_store import E4M3_MIN_CAPABILITY
from tallow.layers import AttentionLayer, AttentionMetadata
from tallow.plugin import AttentionBackend

from . import ops
from .heuristics import MAX_SPLITS, block_size_reasons, head_dim_reasons, next_pow2
from .testing import make_case

#: lowest CUDA compute capability (major, minor): bf16 tensor-core products need Ampere
MIN_CAPABILITY = (8, 0)
DTYPES = {"auto", "float16", "bfloat16", "float32"}
TENSOR_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: cache dtypes the kernels read (widening to the activations' dtype) and write (rounding)
CACHE_DTYPES = TENSOR_DTYPES + (torch.float8_e4m3fn, torch.float8_e5m2)


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
    batch for splits in _split_counts_per_reduce_width()
    for batch in (([1, 4], [6, 2], 0, splits), ([1, 1], [7, 3], 0, splits),
                  ([1, 1], [7, 3], 1, splits))]


def _capability(index: int | None) -> tuple[int, int]:
    """Compute capability of CUDA device ``index`` (None: the current device)."""
    return torch.cuda.get_device_capability(index if index is not None else
                                            torch.cuda.current_device())


def _cache_dtype_reasons(what: str, dtype: torch.dtype) -> list[str]:
    if dtype in CACHE_DTYPES:
        return []
    return [f"{what} {dtype} is not supported (expected one of "
            + ", ".join(str(d).removeprefix("torch.") for d in CACHE_DTYPES) + ")"]


def _get(obj: Any, *path: str, default: Any = None) -> Any:
    for name in path:
        if obj is None:
            return default
        obj = getattr(obj, name, None)
    return default if obj is None else obj


def _cuda_index(device: str) -> int | None:
    """The device index named by ``model.device`` ("cuda:N" -> N; "cuda"/"auto" -> current)."""
    if device.startswith("cuda:"):
        try:
            return int(device.split(":", 1)[1])
        except ValueError:
            return None
    return None


class TritonAttentionBackend(AttentionBackend):
    """Paged attention through the Triton kernels of :mod:`tallow_attention_triton.ops`.

    Serves fp16, bf16 and fp32 models on CUDA devices of compute capability 8.0 or newer, with
    elementwise KV codecs (``auto``: K/V cached in the model's dtype; ``fp8`` and ``fp8_e5m2``
    of tallow-kvcache-fp8), head sizes that are multiples of 16 up to 256 and power-of-two
    block sizes up to 256.
    """

    name: ClassVar[str] = "triton"
    supports_cuda_graph: ClassVar[bool] = True

    def __init__(self, config: Any = None) -> None:
        self.config = config
        settings = _get(config, "plugins", "settings", default={}) or {}
        own = settings.get("tallow-attention-triton", {}) if isinstance(settings, dict) else {}
        #: fixed split count for decode (None: chosen per batch by the heuristics)
        self.num_splits: int | None = own.get("num_splits")
        if self.num_splits is not None and (not isinstance(self.num_splits, int)
                                            or self.num_splits < 1):
            raise ValueError("plugins.settings.tallow-attention-triton.num_splits must be a "
                             f"positive integer, got {self.num_splits!r}")
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
            reasons.append(f"model.dtype {dtype!r} is not supported (expected one of "
                           f"{', '.join(sorted(DTYPES))})")
        reasons += block_size_reasons(block_size)
        if device == "cpu":
            reasons.append("model.device is 'cpu' (the triton backend needs a CUDA device)")
            return reasons
        try:
            import triton  # noqa: F401
        except Exception as exc:  # pragma: no cover - triton ships with the core
            reasons.append(f"triton cannot be imported: {type(exc).__name__}: {exc}")
            return reasons
        if not torch.cuda.is_available():
            reasons.append("no CUDA device (torch.cuda.is_available() is False)")
            return reasons
        index = _cuda_index(device)
        if index is not None and index >= torch.cuda.device_count():
            reasons.append(f"model.device {device!r} does not exist "
                           f"({torch.cuda.device_count()} CUDA device(s))")
            return reasons
        cap = _capability(index)
        if tuple(cap) < MIN_CAPABILITY:
            reasons.append(f"CUDA compute capability {cap[0]}.{cap[1]} is below "
                           f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}")
        return reasons

    def supports_kv_codec(self, codec: Any, cache_dtype: torch.dtype) -> list[str]:
        """Reasons the kernels cannot keep K/V as ``codec`` does: they serve elementwise codecs
        (plain casts) into any of :data:`CACHE_DTYPES`."""
        reasons = super().supports_kv_codec(codec, cache_dtype)
        reasons += _cache_dtype_reasons("cache dtype", cache_dtype)
        if cache_dtype == torch.float8_e4m3fn:
            reasons += self._e4m3_reasons()
        return reasons

    def _e4m3_reasons(self) -> list[str]:
        device = str(_get(self.config, "model", "device", default="auto"))
        if device == "cpu" or not torch.cuda.is_available():
            return []
        index = _cuda_index(device)
        cap = _capability(index)
        if tuple(cap) >= E4M3_MIN_CAPABILITY:
            return []
        need = ".".join(map(str, E4M3_MIN_CAPABILITY))
        return [f"cache dtype float8_e4m3fn needs CUDA compute capability {need} (Triton has no "
                f"e4m3 conversions below it), this device has {cap[0]}.{cap[1]}: use kv codec "
                "fp8_e5m2, or runner.attention_backend: torch"]

    @staticmethod
    def supports_layer(layer: AttentionLayer) -> list[str]:
        """Reasons this backend cannot run ``layer`` (empty when it can). The model runner
        may call it once per layer after building the model; ``forward`` enforces it too."""
        reasons = head_dim_reasons(layer.head_dim)
        if layer.num_heads % layer.num_kv_heads:
            reasons.append(f"num_heads {layer.num_heads} is not a multiple of num_kv_heads "
                           f"{layer.num_kv_heads}")
        if not layer.causal and layer.sliding_window:
            reasons.append("a sliding window on a bidirectional (causal=False) layer")
        return reasons

    # -- the step -------------------------------------------------------------------------
    def _check(self, layer: AttentionLayer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               kv_cache: torch.Tensor, meta: AttentionMetadata) -> None:
        n = q.shape[0]
        if k.shape[0] != n or v.shape[0] != n or meta.slot_mapping.shape[0] != n:
            raise ValueError(
                f"triton attention, layer {layer.layer_index}: q, k, v and meta.slot_mapping "
                f"must have the same number of rows, got {n}, {k.shape[0]}, {v.shape[0]}, "
                f"{meta.slot_mapping.shape[0]}")
        key = (layer, q.dtype, k.dtype, v.dtype, kv_cache.dtype, q.device,
               tuple(q.shape[1:]), tuple(k.shape[1:]), tuple(v.shape[1:]),
               tuple(kv_cache.shape[2:]), kv_cache.stride(-1), meta.block_size)
        if key in self._checked:
            return
        reasons = self.supports_layer(layer)
        hq, hkv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
        if q.dim() != 3 or tuple(q.shape[1:]) != (hq, d):
            reasons.append(f"q must be [T, {hq}, {d}], got {list(q.shape)}")
        for name, t in (("k", k), ("v", v)):
            if t.dim() != 3 or tuple(t.shape[1:]) != (hkv, d):
                reasons.append(f"{name} must be [T, {hkv}, {d}], got {list(t.shape)}")
        if kv_cache.dim() != 5 or kv_cache.shape[0] != 2 or tuple(kv_cache.shape[3:]) != (hkv, d):
            reasons.append(f"kv_cache must be [2, blocks, block_size, {hkv}, {d}], got "
                           f"{list(kv_cache.shape)}")
        elif kv_cache.stride(-1) != 1:
            reasons.append("kv_cache must be contiguous in its last dimension")
        else:
            reasons += block_size_reasons(kv_cache.shape[2])
            if kv_cache.shape[2] != meta.block_size:
                reasons.append(f"kv_cache block size {kv_cache.shape[2]} differs from "
                               f"meta.block_size {meta.block_size}")
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.dtype not in TENSOR_DTYPES:
                reasons.append(f"{name} dtype {t.dtype} is not supported (expected float16, "
                               "bfloat16 or float32)")
        reasons += _cache_dtype_reasons("kv_cache dtype", kv_cache.dtype)
        if q.device.type != "cuda" and not ops.interpreting():
            reasons.append(f"tensors are on {q.device}; the triton backend needs CUDA tensors")
        if reasons:
            raise ValueError(f"triton attention, layer {layer.layer_index}: " + "; ".join(reasons))
        self._checked.add(key)

    def warm_up(self, layers: list[AttentionLayer], kv_caches: list[torch.Tensor],
                dtype: torch.dtype) -> None:
        """Launch every kernel variant once on tiny batches of each distinct layer shape:
        Triton compiles a variant on its first launch (seconds each; cached on disk for later
        processes), and the engine's warm-up steps, with their short prompts, reach neither
        split contexts beside prompts nor most reduce widths.

        Per shape: a prompt-only step; prompts beside a decode and decode-only steps with one
        split and with a split count for each width of the reduce (up to ``MAX_SPLITS``);
        decode-only with the store fused into the split launch and, with a padding row, not.
        The batches use caches of their own, laid out as ``kv_caches``."""
        done: set[tuple[Any, ...]] = set()
        saved = self.num_splits
        try:
            for layer, cache in zip(layers, kv_caches):
                key = (layer.num_heads, layer.num_kv_heads, layer.head_dim,
                       bool(layer.sliding_window), bool(layer.logit_softcap), layer.causal,
                       cache.dtype, cache.shape[2])
                if key in done:
                    continue
                done.add(key)
                for query_lens, context_lens, padding, splits in _WARM_UP_BATCHES:
                    if not layer.causal:  # encoder sequences are always computed whole
                        context_lens = [0] * len(context_lens)
                    case = make_case(query_lens=query_lens, context_lens=context_lens,
                                     num_heads=layer.num_heads, num_kv_heads=layer.num_kv_heads,
                                     head_dim=layer.head_dim, block_size=cache.shape[2],
                                     dtype=dtype, cache_dtype=cache.dtype, device=cache.device,
                                     sliding_window=layer.sliding_window,
                                     logit_softcap=layer.logit_softcap, scale=layer.scale,
                                     padding_rows=padding, causal=layer.causal)
                    self.num_splits = splits
                    self.forward(case.layer, case.q, case.k, case.v, case.kv_cache, case.meta)
        finally:
            self.num_splits = saved

    def forward(self, layer: AttentionLayer, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                kv_cache: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """Store ``k``/``v`` at ``meta.slot_mapping``, return attention [T, Hq, D] for ``q``.

        Rows past ``query_start_loc[num_seqs]`` (padding) are left unwritten.
        """
        self._check(layer, q, k, v, kv_cache, meta)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        common = dict(query_start_loc=meta.query_start_loc, seq_lens=meta.seq_lens,
                      block_tables=meta.block_tables, num_seqs=meta.num_seqs,
                      scale=layer.scale, sliding_window=layer.sliding_window,
                      logit_softcap=layer.logit_softcap, num_splits=self.num_splits,
                      max_seq_len=meta.max_seq_len)
        if meta.is_decode_only:
            splits = common["num_splits"] or ops.choose_num_splits(
                q, kv_cache, meta.num_seqs, meta.max_seq_len)
            common["num_splits"] = splits
            if splits > 1 and q.shape[0] == meta.num_seqs:
                # Small batches are launch-latency bound: the store rides in the attention
                # launch. With one split (large batches, bandwidth bound) the fused variant's
                # extra registers cost occupancy, so the store launches on its own (H200).
                return ops.decode_attention(q, kv_cache, out, k=k, v=v,
                                            slot_mapping=meta.slot_mapping, **common)
            ops.store_kv(kv_cache, k, v, meta.slot_mapping)
            return ops.decode_attention(q, kv_cache, out, **common)
        ops.store_kv(kv_cache, k, v, meta.slot_mapping)
        qsl = meta.query_start_loc_cpu
        singles = True if qsl is None else any(b - a == 1 for a, b in zip(qsl, qsl[1:]))
        prefill_args = {name: val for name, val in common.items()
                        if name not in ("num_splits", "max_seq_len")}
        # A one-query sequence goes to the decode kernel either way: in a bidirectional layer
        # it is a whole one-token sequence, whose query sees its one key in both kernels.
        ops.prefill_attention(q, kv_cache, out, skip_single_query=singles,
                              causal=layer.causal, **prefill_args)
        if singles:
            ops.decode_attention(q, kv_cache, out, mixed=True, **common)
        return out
