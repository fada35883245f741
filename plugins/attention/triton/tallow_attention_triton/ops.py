"""Host-side launchers of the Triton paged-attention kernels.

Each function takes device tensors laid out as :class:`tallow.layers.AttentionMetadata`
describes and launches kernels without reading anything back from the device, so every one of
them may run inside CUDA-graph capture. Grid sizes come from host integers only (token count,
sequence count, head counts, the split count). Where :func:`tallow.kernels.pdl.pdl_enabled`
says so (compute capability 9.0+), they launch with Programmatic Dependent Launch; every kernel
here reads only this step's data, so each waits for the previous grid before anything else.

Under the Triton interpreter (``TRITON_INTERPRET=1`` in the environment before triton is first
imported) the same kernels run on CPU tensors; that is how CI on machines without a GPU checks
their logic.
"""

from __future__ import annotations

import os
from functools import lru_cache

import torch

from tallow.kernels import LayerKVCache, cache_saturation, pdl_enabled

from . import turbo_ops
from .heuristics import (
    DEFAULT_CAPABILITY,
    DEFAULT_SM_COUNT,
    cdiv,
    decode_num_splits,
    decode_tiles,
    dot_precision,
    next_pow2,
    nibble_decode_tiles,
    prefill_tiles,
)
from .kernels.decode import decode_reduce_kernel, decode_split_kernel
from .kernels.prefill import prefill_kernel
from .kernels.turbo_decode import decode_nibbles_kernel
from .kernels.store import store_kv_kernel

LOG2E = 1.4426950408889634
#: decode a 4-bit turbo cache with its own kernel (kernels/turbo_decode.py); False: with the
#: split kernel that serves every cache, kept so the two can be compared on the same batch
#: (bench/gpu/kv_turbo_probe.py)
NIBBLE_DECODE = True
#: the nibble kernel multiplies half-width tiles (head size / 2 coordinates each), and a
#: tensor-core product needs at least 16 along its reduction: smaller heads take the split kernel
NIBBLE_MIN_HEAD_DIM = 32


def nibble_decode(bits: int, head_dim: int) -> bool:
    """Whether a decode over a ``bits``-bit turbo cache runs the nibble kernel."""
    return bits == 4 and NIBBLE_DECODE and head_dim >= NIBBLE_MIN_HEAD_DIM


def interpreting() -> bool:
    """True when Triton kernels run in its CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@lru_cache(maxsize=None)
def _device_facts(device_index: int) -> tuple[int, int]:
    props = torch.cuda.get_device_properties(device_index)
    return props.multi_processor_count, props.major * 10 + props.minor


def device_facts(device: torch.device) -> tuple[int, int]:
    """(SM count, compute capability as major*10+minor) of ``device``; a Hopper data-centre
    GPU's for CPU tensors (the interpreter)."""
    if device.type != "cuda":
        return DEFAULT_SM_COUNT, DEFAULT_CAPABILITY
    return _device_facts(device.index if device.index is not None else torch.cuda.current_device())


def score_constants(scale: float, logit_softcap: float | None) -> tuple[float, float]:
    """(qk_scale, softcap) as the kernels take them: scores in the log2 domain."""
    if logit_softcap:
        return scale / logit_softcap, logit_softcap * LOG2E
    return scale * LOG2E, 0.0


def _precision(dtype: torch.dtype) -> tuple[str, bool]:
    """(tl.dot input precision, upcast bf16 operands): the interpreter multiplies bf16 storage
    as integers, so there bf16 operands are widened to fp32 first."""
    return dot_precision(torch.finfo(dtype).bits // 8), interpreting() and dtype == torch.bfloat16


def _cache_strides(cache: torch.Tensor) -> tuple[int, int, int]:
    """(block, offset-in-block, head) strides of a paged K or V tensor [blocks, bs, Hkv, D];
    K and V of one layer are laid out alike, so one set serves both."""
    return cache.stride(0), cache.stride(1), cache.stride(2)


def _paged(
    kv_cache: LayerKVCache,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, int, int]:
    """(K, V, K scales, V scales, scale strides (block, offset), code bits) of a layer's cache
    as the attention kernels take them: the cast tensors, or a turbo cache's codes and scales
    (a cast cache passes its K and V where no scale is read)."""
    if turbo_ops.is_turbo(kv_cache):
        codes, scales = kv_cache["k_codes"], kv_cache["k_scales"]
        return (
            codes,
            kv_cache["v_codes"],
            scales,
            kv_cache["v_scales"],
            scales.stride(0),
            scales.stride(1),
            turbo_ops.bits_of(kv_cache.head_dim, codes.shape[3]),
        )
    k_cache, v_cache = kv_cache["k"], kv_cache["v"]
    return k_cache, v_cache, k_cache, v_cache, 0, 0, 0


def _sinks_arg(sinks: torch.Tensor | None, num_heads: int, q: torch.Tensor) -> torch.Tensor:
    """The attention sinks as the kernels read them (float32 [Hq], contiguous, on q's device),
    or ``q`` where the kernels read none."""
    if sinks is None:
        return q
    if tuple(sinks.shape) != (num_heads,):
        raise ValueError(
            f"attention sinks must hold one value per query head ({num_heads}), "
            f"got shape {tuple(sinks.shape)}"
        )
    if sinks.dtype != torch.float32 or not sinks.is_contiguous() or sinks.device != q.device:
        sinks = sinks.to(device=q.device, dtype=torch.float32).contiguous()
    return sinks


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def f16_products(dtype: torch.dtype, cache_bytes: int) -> bool:
    """Whether the tile products run in fp16 (kernels.common.product_operand): over an 8-bit
    cache with 16-bit activations. fp32 activations keep their fp32 path."""
    return cache_bytes == 1 and torch.finfo(dtype).bits == 16


# -- compile-time parameters of each launch (also used by the tests that compile for sm_90) --
# ``pdl``: launch with Programmatic Dependent Launch (tallow.kernels.pdl); the kernel's USE_PDL
# and the launch option always go together.
# ``saturate``: the clamp of values stored into the cache (tallow.kernels.kv_cache.
# cache_saturation of the cache dtype; 0.0 = none).
# ``head_scales``: values divided by a scale per KV head before the cast (a cast codec with
# per-head scales); ``key_offset``: keys less their head's offset vector first (centred keys).
def store_spec(
    *,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    saturate: float = 0.0,
    head_scales: bool = False,
    key_offset: bool = False,
    pdl: bool = False,
) -> dict[str, object]:
    d_pad = next_pow2(head_dim)
    return dict(
        NUM_KV_HEADS=num_kv_heads,
        HEAD_DIM=head_dim,
        HEADS_PER_PROGRAM=min(next_pow2(num_kv_heads), max(1, 4096 // d_pad)),
        D_PAD=d_pad,
        BLOCK_SIZE=block_size,
        SATURATE=saturate,
        HEAD_SCALES=head_scales,
        KEY_OFFSET=key_offset,
        num_warps=4,
        USE_PDL=pdl,
        launch_pdl=pdl,
    )


# ``kv_bits``: the code width of a turbo cache (turbo_ops), 0 for a cache that casts. A turbo
# cache takes none of the 8-bit float cache's widening; its prefill takes the tiles of an 8-bit
# cache and its decode those of a 16-bit one (4-warp programs: the unpacking needs their
# registers; one-warp programs spill at head size 96 and 128 with 3-bit codes, sm_90) with
# two pipeline stages (three spill at head size 96).
def prefill_spec(
    *,
    head_dim: int,
    group: int,
    dtype: torch.dtype,
    block_size: int,
    sliding_window: int | None,
    logit_softcap: float | None,
    skip_single_query: bool,
    capability: int = DEFAULT_CAPABILITY,
    cache_bytes: int = 2,
    kv_bits: int = 0,
    pdl: bool = False,
    causal: bool = True,
    sinks: bool = False,
    chunked: bool = False,
) -> dict[str, object]:
    tiles = prefill_tiles(
        head_dim,
        group,
        torch.finfo(dtype).bits // 8,
        capability,
        windowed_or_capped=bool(sliding_window or logit_softcap),
        cache_bytes=cache_bytes,
        codes=bool(kv_bits),
    )
    precision, upcast = _precision(dtype)
    cast_bytes = 2 if kv_bits else cache_bytes
    return dict(
        GROUP=group,
        HEAD_DIM=head_dim,
        D_PAD=next_pow2(head_dim),
        KV_BITS=kv_bits,
        BLOCK_M=tiles.block_m,
        BLOCK_Q=tiles.block_q,
        BLOCK_SIZE=block_size,
        TILE_N=tiles.tile_n,
        USE_WINDOW=bool(sliding_window),
        CHUNKED=chunked,
        USE_SOFTCAP=bool(logit_softcap),
        SKIP_SINGLE=skip_single_query,
        CAUSAL=bool(causal),
        F16_PRODUCTS=f16_products(dtype, cast_bytes),
        PRECISION=precision,
        UPCAST=upcast,
        USE_SINKS=sinks,
        USE_PDL=pdl,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
        launch_pdl=pdl,
    )


def decode_spec(
    *,
    num_heads: int,
    group: int,
    head_dim: int,
    dtype: torch.dtype,
    block_size: int,
    sliding_window: int | None,
    logit_softcap: float | None,
    mixed: bool,
    single_split: bool,
    fused_store: bool,
    saturate: float = 0.0,
    cache_bytes: int = 2,
    kv_bits: int = 0,
    pdl: bool = False,
    sinks: bool = False,
    chunked: bool = False,
) -> dict[str, object]:
    cast_bytes = 2 if kv_bits else cache_bytes
    tiles = decode_tiles(
        head_dim, group, torch.finfo(dtype).bits // 8, cast_bytes, codes=bool(kv_bits)
    )
    precision, upcast = _precision(dtype)
    return dict(
        NUM_Q_HEADS=num_heads,
        GROUP=group,
        G_PAD=tiles.g_pad,
        HEAD_DIM=head_dim,
        D_PAD=next_pow2(head_dim),
        KV_BITS=kv_bits,
        BLOCK_SIZE=block_size,
        TILE_N=tiles.tile_n,
        USE_WINDOW=bool(sliding_window),
        CHUNKED=chunked,
        USE_SOFTCAP=bool(logit_softcap),
        MIXED=mixed,
        SINGLE_SPLIT=single_split,
        FUSED_STORE=fused_store,
        SATURATE=saturate if fused_store else 0.0,
        F16_PRODUCTS=f16_products(dtype, cast_bytes),
        WIDEN_V_IN_REGISTERS=cast_bytes == 1,
        WIDEN_V_IN_PTX=f16_products(dtype, cast_bytes) and not interpreting(),
        LAZY_RESCALE=cast_bytes == 1,
        PRECISION=precision,
        UPCAST=upcast,
        USE_SINKS=sinks,
        USE_PDL=pdl,
        num_warps=tiles.num_warps,
        num_stages=2 if kv_bits else tiles.num_stages,
        launch_pdl=pdl,
    )


# A 4-bit turbo cache decodes in its own kernel (kernels/turbo_decode.py), with fp16 products
# for 16-bit activations and the codes unpacked in PTX on the GPU.
def decode_nibbles_spec(
    *,
    num_heads: int,
    group: int,
    head_dim: int,
    dtype: torch.dtype,
    block_size: int,
    sliding_window: int | None,
    logit_softcap: float | None,
    mixed: bool,
    single_split: bool,
    pdl: bool = False,
    sinks: bool = False,
    chunked: bool = False,
) -> dict[str, object]:
    tiles = nibble_decode_tiles(head_dim, group, torch.finfo(dtype).bits // 8)
    f16 = torch.finfo(dtype).bits == 16
    precision = dot_precision(2 if f16 else 4)
    d_pad = next_pow2(head_dim)
    return dict(
        NUM_Q_HEADS=num_heads,
        GROUP=group,
        G_PAD=tiles.g_pad,
        HEAD_DIM=head_dim,
        D_PAD=d_pad,
        HALF=head_dim // 2,
        H_PAD=d_pad // 2,
        BLOCK_SIZE=block_size,
        TILE_N=tiles.tile_n,
        USE_WINDOW=bool(sliding_window),
        CHUNKED=chunked,
        USE_SOFTCAP=bool(logit_softcap),
        MIXED=mixed,
        SINGLE_SPLIT=single_split,
        F16_PRODUCTS=f16,
        UNPACK_IN_PTX=f16 and not interpreting(),
        # the interpreter's fp16 matmul accumulates in fp16: widen there
        PRECISION=precision,
        UPCAST=interpreting(),
        USE_SINKS=sinks,
        USE_PDL=pdl,
        num_warps=tiles.num_warps,
        num_stages=tiles.num_stages,
        launch_pdl=pdl,
    )


def reduce_spec(
    *,
    num_heads: int,
    head_dim: int,
    num_splits: int,
    tile_n: int,
    sliding_window: int | None,
    mixed: bool,
    pdl: bool = False,
    sinks: bool = False,
    chunked: bool = False,
) -> dict[str, object]:
    return dict(
        NUM_Q_HEADS=num_heads,
        HEAD_DIM=head_dim,
        D_PAD=next_pow2(head_dim),
        # at least 16: split counts that vary with the batch share one compiled variant
        S_PAD=max(16, next_pow2(num_splits)),
        TILE_N=tile_n,
        USE_WINDOW=bool(sliding_window),
        CHUNKED=chunked,
        MIXED=mixed,
        USE_SINKS=sinks,
        USE_PDL=pdl,
        num_warps=4,
        launch_pdl=pdl,
    )


# -- launchers ---------------------------------------------------------------------------------
def store_kv(
    kv_cache: LayerKVCache, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Write ``k``/``v`` [T, Hkv, D] into the layer's cache at ``slot_mapping`` [T] (int,
    -1 = skip), converting to the cache's dtype as its codec's reference ``encode`` does
    (:func:`tallow.kernels.kv_cache.to_cache_dtype`, after subtracting the head's key offset
    when the cache has ``k_offset`` and dividing by the head's scale when it has
    ``k_scale``/``v_scale``; a turbo cache: rotated, quantized and packed,
    :func:`turbo_ops.store_turbo`)."""
    n_tokens, n_kv, head_dim = k.shape
    if n_tokens == 0:
        return
    if turbo_ops.is_turbo(kv_cache):
        turbo_ops.store_turbo(kv_cache, k, v, slot_mapping)
        return
    k_cache, v_cache = kv_cache["k"], kv_cache["v"]
    k, v = _last_dim_contiguous(k), _last_dim_contiguous(v)
    k_scale, v_scale = kv_cache.get("k_scale"), kv_cache.get("v_scale")
    k_offset = kv_cache.get("k_offset")
    spec = store_spec(
        num_kv_heads=n_kv,
        head_dim=head_dim,
        block_size=k_cache.shape[1],
        saturate=cache_saturation(k_cache.dtype),
        head_scales=k_scale is not None,
        key_offset=k_offset is not None,
        pdl=pdl_enabled(k_cache),
    )
    stride_cb, stride_co, stride_ch = _cache_strides(k_cache)
    grid = (n_tokens, cdiv(n_kv, spec["HEADS_PER_PROGRAM"]))
    # a cache without scales or offsets passes its K and V where those are not read
    store_kv_kernel[grid](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k_cache if k_scale is None else k_scale,
        v_cache if v_scale is None else v_scale,
        k_cache if k_offset is None else k_offset,
        k.stride(0),
        k.stride(1),
        v.stride(0),
        v.stride(1),
        stride_cb,
        stride_co,
        stride_ch,
        **spec,
    )


def scale_queries(q: torch.Tensor, kv_cache: LayerKVCache) -> torch.Tensor:
    """``q`` [T, Hq, D] times its KV head's ``k_scale`` when the cache stores keys divided by
    a scale per head (a cast codec with per-head scales), else ``q`` itself: ``(q * s) . k'``
    is ``q . k`` for a stored ``k' = k / s``, so the attention kernels read the cache as an
    unscaled one. Once per step, outside the kernels' loops."""
    k_scale = kv_cache.get("k_scale")
    if k_scale is None:
        return q
    per_q_head = k_scale.repeat_interleave(q.shape[1] // k_scale.shape[0])
    return (q.float() * per_q_head[:, None]).to(q.dtype)


def scale_output(out: torch.Tensor, kv_cache: LayerKVCache) -> torch.Tensor:
    """The attention output [T, Hq, D] times its KV head's ``v_scale`` when the cache stores
    values divided by a scale per head (the softmax weights sum to one, so the output of the
    stored values times the scale is the output of the values), in place."""
    v_scale = kv_cache.get("v_scale")
    if v_scale is not None:
        out.mul_(v_scale.repeat_interleave(out.shape[1] // v_scale.shape[0])[:, None])
    return out


def visible_window(
    sliding_window: int | None, attention_chunk_size: int | None
) -> tuple[int, bool]:
    """(the kernels' ``window`` argument, ``CHUNKED``) of a layer: its sliding window, or its
    chunk size with ``CHUNKED`` (0, False: every earlier key is visible)."""
    if sliding_window and attention_chunk_size:
        raise ValueError(
            f"a layer has either a sliding window or chunked local attention, got "
            f"sliding_window={sliding_window} and attention_chunk_size={attention_chunk_size}"
        )
    if attention_chunk_size:
        return int(attention_chunk_size), True
    return int(sliding_window or 0), False


def prefill_attention(
    q: torch.Tensor,
    kv_cache: LayerKVCache,
    out: torch.Tensor,
    *,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    num_seqs: int,
    scale: float,
    sliding_window: int | None = None,
    logit_softcap: float | None = None,
    skip_single_query: bool = False,
    causal: bool = True,
    sinks: torch.Tensor | None = None,
    attention_chunk_size: int | None = None,
) -> torch.Tensor:
    """Attention of every sequence's queries over its cached context, into ``out``: causal,
    or with ``causal`` False every query over all ``seq_lens[i]`` keys (encoders). ``sinks``
    (float32 [Hq]): a logit per query head that joins every softmax's denominator.
    ``attention_chunk_size``: chunked local attention, each query over the keys of its own
    chunk of that many positions (not with ``sliding_window``).

    q, out [T, Hq, D]; K/V of all tokens up to ``seq_lens[i]`` must already be in the cache.
    With ``skip_single_query`` the rows of sequences with one query are left untouched (for
    :func:`decode_attention` with ``mixed=True``).
    """
    n_tokens, n_heads, head_dim = q.shape
    if n_tokens == 0 or num_seqs == 0:
        return out
    window, chunked = visible_window(sliding_window, attention_chunk_size)
    q = _last_dim_contiguous(q)
    k_cache, v_cache, k_scales, v_scales, stride_sb, stride_so, bits = _paged(kv_cache)
    n_kv = k_cache.shape[2]
    group = n_heads // n_kv
    spec = prefill_spec(
        head_dim=head_dim,
        group=group,
        dtype=q.dtype,
        block_size=k_cache.shape[1],
        sliding_window=window,
        logit_softcap=logit_softcap,
        skip_single_query=skip_single_query,
        capability=device_facts(q.device)[1],
        cache_bytes=k_cache.element_size(),
        kv_bits=bits,
        pdl=pdl_enabled(q),
        causal=causal,
        sinks=sinks is not None,
        chunked=chunked,
    )
    qk_scale, softcap = score_constants(scale, logit_softcap)
    stride_cb, stride_co, stride_ch = _cache_strides(k_cache)
    grid = (n_tokens // spec["BLOCK_Q"] + num_seqs, n_kv)
    prefill_kernel[grid](
        q,
        k_cache,
        v_cache,
        k_scales,
        v_scales,
        block_tables,
        seq_lens,
        query_start_loc,
        out,
        _sinks_arg(sinks, n_heads, q),
        qk_scale,
        softcap,
        window,
        num_seqs,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        stride_cb,
        stride_co,
        stride_ch,
        block_tables.stride(0),
        stride_sb,
        stride_so,
        **spec,
    )
    return out


def choose_num_splits(
    q: torch.Tensor, kv_cache: LayerKVCache, num_seqs: int, max_seq_len: int | None
) -> int:
    """The decode split count for a batch of ``q`` [T, Hq, D] over ``kv_cache``:
    :func:`heuristics.decode_num_splits` on this device for the decode tiles' warps, ignoring
    the ``max_seq_len`` hint while a CUDA graph is being captured."""
    device = q.device
    k_cache = _paged(kv_cache)[0]
    n_kv = k_cache.shape[2]
    turbo = turbo_ops.is_turbo(kv_cache)
    if nibble_decode(_paged(kv_cache)[-1], q.shape[-1]):
        tiles = nibble_decode_tiles(q.shape[-1], q.shape[1] // n_kv, q.element_size())
    else:
        tiles = decode_tiles(
            q.shape[-1],
            q.shape[1] // n_kv,
            q.element_size(),
            2 if turbo else k_cache.element_size(),
            codes=turbo,
        )
    capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    return decode_num_splits(
        num_seqs,
        n_kv,
        sm_count=device_facts(device)[0],
        max_seq_len=None if capturing else max_seq_len,
        num_warps=tiles.num_warps,
    )


def decode_attention(
    q: torch.Tensor,
    kv_cache: LayerKVCache,
    out: torch.Tensor,
    *,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    num_seqs: int,
    scale: float,
    sliding_window: int | None = None,
    logit_softcap: float | None = None,
    num_splits: int | None = None,
    max_seq_len: int | None = None,
    mixed: bool = False,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    slot_mapping: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    attention_chunk_size: int | None = None,
) -> torch.Tensor:
    """Split-K attention for sequences with a single query (row ``query_start_loc[i]``).

    ``num_splits`` None picks it with :func:`heuristics.decode_num_splits` from the sequence
    count and the ``max_seq_len`` hint (ignored while a CUDA graph is being captured, so the
    captured launch suits every length). ``mixed``: serve only the sequences with exactly one
    query and leave the rest to :func:`prefill_attention`; otherwise sequences with no query
    (CUDA-graph padding) are skipped. Given ``k``, ``v`` and ``slot_mapping``, this step's K/V
    of each sequence's query row are stored in the same launch (instead of :func:`store_kv`).
    Partials come from the caching allocator with shapes fixed by (num_seqs, Hq, splits), which
    CUDA-graph capture records like any other allocation. ``sinks``: as in
    :func:`prefill_attention`, added where the splits are combined; ``attention_chunk_size``
    as in :func:`prefill_attention`.
    """
    n_heads, head_dim = q.shape[1], q.shape[2]
    if num_seqs == 0:
        return out
    q = _last_dim_contiguous(q)
    k_cache, v_cache, k_scales, v_scales, stride_sb, stride_so, bits = _paged(kv_cache)
    n_kv = k_cache.shape[2]
    group = n_heads // n_kv
    if num_splits is None:
        num_splits = choose_num_splits(q, kv_cache, num_seqs, max_seq_len)
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    fused = k is not None
    if fused and bits:
        raise ValueError(
            "decode_attention stores K/V only into a cache that casts, not into "
            "a turbo cache (use store_kv)"
        )
    if fused:
        if v is None or slot_mapping is None:
            raise ValueError("decode_attention stores K/V only given k, v and slot_mapping")
        k, v = _last_dim_contiguous(k), _last_dim_contiguous(v)
    else:
        k = v = q  # unused by the kernel
        slot_mapping = seq_lens
    qk_scale, softcap = score_constants(scale, logit_softcap)
    stride_cb, stride_co, stride_ch = _cache_strides(k_cache)
    d_pad = next_pow2(head_dim)
    single = num_splits == 1
    if single:
        part_acc = part_ml = out  # unused: a single split writes the output itself
    else:
        n_part = num_seqs * n_heads * num_splits
        scratch = torch.empty(n_part * (d_pad + 2), dtype=torch.float32, device=q.device)
        part_acc = scratch[: n_part * d_pad]
        part_ml = scratch[n_part * d_pad :]
    window, chunked = visible_window(sliding_window, attention_chunk_size)
    sinks_arg = _sinks_arg(sinks, n_heads, q)
    use_sinks = sinks is not None
    if nibble_decode(bits, head_dim):
        spec = decode_nibbles_spec(
            num_heads=n_heads,
            group=group,
            head_dim=head_dim,
            dtype=q.dtype,
            block_size=k_cache.shape[1],
            sliding_window=window,
            logit_softcap=logit_softcap,
            mixed=mixed,
            single_split=single,
            pdl=pdl_enabled(q),
            sinks=use_sinks,
            chunked=chunked,
        )
        decode_nibbles_kernel[(num_seqs, n_kv, num_splits)](
            q,
            k_cache,
            v_cache,
            k_scales,
            v_scales,
            block_tables,
            seq_lens,
            query_start_loc,
            out,
            part_acc,
            part_ml,
            sinks_arg,
            qk_scale,
            softcap,
            window,
            num_splits,
            q.stride(0),
            q.stride(1),
            out.stride(0),
            out.stride(1),
            stride_cb,
            stride_co,
            stride_ch,
            block_tables.stride(0),
            stride_sb,
            stride_so,
            **spec,
        )
    else:
        spec = decode_spec(
            num_heads=n_heads,
            group=group,
            head_dim=head_dim,
            dtype=q.dtype,
            block_size=k_cache.shape[1],
            sliding_window=window,
            logit_softcap=logit_softcap,
            mixed=mixed,
            single_split=single,
            fused_store=fused,
            saturate=cache_saturation(k_cache.dtype),
            cache_bytes=k_cache.element_size(),
            kv_bits=bits,
            pdl=pdl_enabled(q),
            sinks=use_sinks,
            chunked=chunked,
        )
        decode_split_kernel[(num_seqs, n_kv, num_splits)](
            q,
            k,
            v,
            slot_mapping,
            k_cache,
            v_cache,
            k_scales,
            v_scales,
            block_tables,
            seq_lens,
            query_start_loc,
            out,
            part_acc,
            part_ml,
            sinks_arg,
            qk_scale,
            softcap,
            window,
            num_splits,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            v.stride(0),
            v.stride(1),
            out.stride(0),
            out.stride(1),
            stride_cb,
            stride_co,
            stride_ch,
            block_tables.stride(0),
            stride_sb,
            stride_so,
            **spec,
        )
    if not single:
        decode_reduce_kernel[(num_seqs, n_heads)](
            part_acc,
            part_ml,
            seq_lens,
            query_start_loc,
            out,
            sinks_arg,
            window,
            num_splits,
            out.stride(0),
            out.stride(1),
            **reduce_spec(
                num_heads=n_heads,
                head_dim=head_dim,
                num_splits=num_splits,
                tile_n=spec["TILE_N"],
                sliding_window=window,
                mixed=mixed,
                pdl=spec["USE_PDL"],
                sinks=use_sinks,
                chunked=chunked,
            ),
        )
    return out
