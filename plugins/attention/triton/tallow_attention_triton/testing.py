"""Random paged-attention batches and their torch-reference answers, for tests, benchmarks and
the backend's warm-up (tiny batches that make Triton compile each kernel variant).

A batch is built the way the model runner builds one: each sequence has ``context`` tokens
already in the cache and ``query`` new tokens this step; its blocks are drawn at random from the
pool (so block tables are not contiguous). Every cache element that no sequence owns is NaN, so
a kernel that reads a wrong block or a masked-out token turns its output NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from tallow.kernels import CastKVCodec, LayerKVCache, allocate_layer, paged_attention_ref
from tallow.layers import AttentionLayer, AttentionMetadata
from tallow.plugin import KVCodec

from . import turbo_ops


@dataclass
class PagedCase:
    """One step of one layer: inputs, a cache to write into, and the metadata."""

    layer: AttentionLayer
    q: torch.Tensor  # [T, Hq, D]
    k: torch.Tensor  # [T, Hkv, D]
    v: torch.Tensor
    kv_cache: LayerKVCache
    meta: AttentionMetadata
    #: rows of q that belong to a sequence (trailing padding rows excluded)
    valid_rows: int
    query_lens: list[int] = field(default_factory=list)
    seed: int = 0

    def expected_cache(self) -> LayerKVCache:
        """The cache after this step's store by the codec's reference ``encode``."""
        cache = self.kv_cache.clone()
        cache.codec.encode(cache, self.k, self.v, self.meta.slot_mapping)
        return cache

    def reference_output(self, cache: LayerKVCache) -> torch.Tensor:
        """Output rows [valid_rows, Hq, D] by the torch reference over ``cache`` (read through
        its codec's ``decode``)."""
        return paged_attention_ref(
            self.q[: self.valid_rows],
            cache,
            query_start_loc=self.meta.query_start_loc.tolist(),
            seq_lens=self.meta.seq_lens.tolist(),
            block_tables=self.meta.block_tables,
            scale=self.layer.scale,
            sliding_window=self.layer.sliding_window,
            logit_softcap=self.layer.logit_softcap,
            causal=self.layer.causal,
            sinks=self.layer.sinks,
            attention_chunk_size=self.layer.attention_chunk_size,
        )

    def expected(self) -> tuple[torch.Tensor, LayerKVCache]:
        """(output rows [valid_rows, Hq, D], cache after the store), by the torch reference:
        the codec's ``encode``, then attention over its ``decode``."""
        cache = self.expected_cache()
        return self.reference_output(cache), cache


def cast_codec(cache_dtype: torch.dtype) -> CastKVCodec:
    """A codec that casts K and V into ``cache_dtype`` (whatever the model's dtype)."""
    return CastKVCodec(storage=cache_dtype)


def make_case(
    *,
    query_lens: list[int],
    context_lens: list[int],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int = 16,
    dtype: torch.dtype = torch.bfloat16,
    cache_dtype: torch.dtype | None = None,
    codec: KVCodec | None = None,
    device: str | torch.device = "cpu",
    sliding_window: int | None = None,
    logit_softcap: float | None = None,
    scale: float | None = None,
    padding_rows: int = 0,
    spare_blocks: int = 3,
    num_blocks: int | None = None,
    seed: int = 0,
    host_copies: bool = True,
    causal: bool = True,
    head_scales: tuple[list[float], list[float]] | None = None,
    key_offset: torch.Tensor | None = None,
    sinks: torch.Tensor | None = None,
    attention_chunk_size: int | None = None,
) -> PagedCase:
    """A random batch; ``context_lens[i]`` earlier tokens of sequence ``i`` are already cached
    and its ``query_lens[i]`` tokens are this step's (their K/V still to be stored).

    The cache is ``codec``'s, or a cast into ``cache_dtype`` (default: ``dtype``). Earlier
    tokens are stored through the codec's reference ``encode``; every other cache element
    holds NaN where the storage dtype has one (a codec of integer codes is filled with 0xFF
    bytes instead: ones-bits everywhere, which decode to the largest values).

    ``padding_rows`` extra query rows at the end belong to no sequence and have slot -1.
    ``num_blocks`` fixes the pool size (default: what the batch needs + ``spare_blocks``).
    ``host_copies`` False leaves ``query_start_loc_cpu``/``seq_lens_cpu`` None, as a CUDA-graph
    runner does. ``causal`` False makes a bidirectional (encoder) layer, whose sequences the
    engine always computes whole: give it context lengths of 0. ``head_scales`` (K scales, V
    scales; one per KV head) fill a cache's ``k_scale``/``v_scale`` and ``key_offset``
    [Hkv, D] its ``k_offset`` before anything is stored (the random keys are drawn around it).
    ``sinks`` [num_heads]: the layer's attention sinks (float32, moved to ``device``).
    ``attention_chunk_size``: chunked local attention (each query over its own chunk).
    """
    if len(query_lens) != len(context_lens):
        raise ValueError("query_lens and context_lens must have the same length")
    gen = torch.Generator().manual_seed(seed)
    if codec is None:
        codec = cast_codec(cache_dtype or dtype)
    seq_lens = [c + n for c, n in zip(context_lens, query_lens)]
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    needed = sum(blocks_per_seq) + 1  # + the poisoned block
    if num_blocks is None:
        num_blocks = needed - 1 + spare_blocks
    if num_blocks < needed:
        raise ValueError(f"num_blocks {num_blocks} is too small: the batch needs {needed}")
    order = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(blocks_per_seq + [1])
    # Unused table entries point at a poisoned block: reading one shows up as NaN.
    poison = order.pop()
    tables = torch.full((len(seq_lens), width), poison, dtype=torch.int32)
    for i, nb in enumerate(blocks_per_seq):
        tables[i, :nb] = torch.tensor([order.pop() for _ in range(nb)], dtype=torch.int32)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    def keys(n: int) -> torch.Tensor:
        # keys carry the offset their cache is centred on (calibration makes it their mean):
        # stored centred, they are small. Keys far from it would be stored as large centred
        # values, whose scores the softmax compares at a precision no serving step needs.
        k = torch.randn(n, num_kv_heads, head_dim, generator=gen)
        return (k if key_offset is None else k + key_offset).to(dtype)

    cache = allocate_layer(
        codec,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        num_blocks=num_blocks,
        model_dtype=dtype,
    )
    for tensor in cache.paged():
        poison_fill(tensor)
    if head_scales is not None:
        cache["k_scale"].copy_(torch.tensor(head_scales[0]))
        cache["v_scale"].copy_(torch.tensor(head_scales[1]))
    if key_offset is not None:
        cache["k_offset"].copy_(key_offset)
    slots: list[int] = []
    ctx_slots: list[int] = []
    for i, (ctx, n) in enumerate(zip(context_lens, query_lens)):
        for p in range(ctx + n):
            slot = int(tables[i, p // block_size]) * block_size + p % block_size
            (ctx_slots if p < ctx else slots).append(slot)
    n_ctx = len(ctx_slots)
    codec.encode(
        cache,
        keys(n_ctx),
        randn(n_ctx, num_kv_heads, head_dim),
        torch.tensor(ctx_slots, dtype=torch.int64),
    )
    n_tokens = sum(query_lens)
    slots += [-1] * padding_rows
    total = n_tokens + padding_rows
    q = randn(total, num_heads, head_dim)
    k = keys(total)
    v = randn(total, num_kv_heads, head_dim)
    k_store = cache.get("k")
    if k_store is not None and k_store.dtype.itemsize == 1 and k_store.dtype.is_floating_point:
        # This step's K/V already on the 8-bit grid: the store is then exact on the GPU and in
        # Triton's interpreter alike (which rounds ties differently); the rounding itself is
        # checked against torch on the GPU.
        # (a scaled cache: the grid times the head's scale; centred keys: plus the offset)
        k_scale = cache["k_scale"][:, None] if "k_scale" in cache else 1.0
        v_scale = cache["v_scale"][:, None] if "v_scale" in cache else 1.0
        k_offset = cache["k_offset"] if "k_offset" in cache else 0.0
        k = (((k.float() - k_offset) / k_scale).to(k_store.dtype).float() * k_scale + k_offset).to(
            dtype
        )
        v = ((v.float() / v_scale).to(k_store.dtype).float() * v_scale).to(dtype)
    qsl = [0]
    for n in query_lens:
        qsl.append(qsl[-1] + n)
    dev = torch.device(device)
    meta = AttentionMetadata(
        num_seqs=len(seq_lens),
        num_tokens=total,
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=dev),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
        block_tables=tables.to(dev),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
        max_query_len=max(query_lens + [0]),
        max_seq_len=max(seq_lens + [0]),
        block_size=block_size,
        query_start_loc_cpu=qsl if host_copies else None,
        seq_lens_cpu=seq_lens if host_copies else None,
    )
    layer = AttentionLayer(
        layer_index=0,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        scale=scale if scale is not None else head_dim**-0.5,
        sliding_window=sliding_window,
        logit_softcap=logit_softcap,
        causal=causal,
        sinks=None if sinks is None else sinks.float().to(dev),
        attention_chunk_size=attention_chunk_size,
    )
    return PagedCase(
        layer=layer,
        q=q.to(dev),
        k=k.to(dev),
        v=v.to(dev),
        kv_cache=to_device(cache, dev),
        meta=meta,
        valid_rows=n_tokens,
        query_lens=list(query_lens),
        seed=seed,
    )


def poison_fill(tensor: torch.Tensor) -> None:
    """Fill ``tensor`` with NaN, or with 0xFF bytes where its dtype has no NaN."""
    if tensor.dtype.is_floating_point:
        tensor.fill_(float("nan"))
    else:
        tensor.view(torch.uint8).fill_(0xFF)


def to_device(cache: LayerKVCache, device: torch.device) -> LayerKVCache:
    """``cache`` with its tensors on ``device``."""
    return cache.with_tensors({n: t.to(device) for n, t in cache.tensors.items()})


def calibrate_randomly(case: PagedCase, seed: int) -> PagedCase:
    """Give ``case``'s turbo cache offsets and smoothing as a calibration would (random
    values), so that the kernels' handling of each is exercised; under a softcap the key
    offset stays zero, as calibration leaves it. A cache without them is left alone."""
    gen = torch.Generator().manual_seed(seed)
    cache = case.kv_cache
    for name in ("k_offset", "v_offset"):
        if name in cache:
            cache[name].copy_(torch.randn(cache[name].shape, generator=gen))
    if case.layer.logit_softcap and "k_offset" in cache:
        cache["k_offset"].zero_()
    if "k_smooth" in cache:
        cache["k_smooth"].copy_(torch.rand(cache["k_smooth"].shape, generator=gen) * 1.5 + 0.5)
    return case


def grow_keys(case: PagedCase, step: float = 2.0, period: int = 20) -> PagedCase:
    """Scale the cached keys of each sequence's ``j``-th block by ``1 + step * (j % period)``
    (read back and stored again through the codec), so that attention scores keep climbing
    along the context, fall back and climb again: the running maximum of an online softmax
    then grows by large steps tile after tile, not only at the first tile as with plain
    random keys."""
    cache = case.kv_cache
    bs = cache.block_size
    tables = case.meta.block_tables.cpu()
    for i, seq_len in enumerate(case.meta.seq_lens.tolist()):
        context = seq_len - case.query_lens[i] if i < len(case.query_lens) else seq_len
        if context <= 0:
            continue
        blocks = tables[i, : -(-context // bs)].long()
        k, v = cache.codec.decode(cache, blocks.to(cache.device))
        pos = torch.arange(context)
        factor = 1.0 + step * ((pos // bs) % period).float()
        slots = blocks[pos // bs] * bs + pos % bs
        cache.codec.encode(
            cache,
            (k[:context].cpu() * factor[:, None, None]).to(case.q.dtype).to(cache.device),
            v[:context].to(case.q.dtype),
            slots.to(cache.device),
        )
    return case


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """assert_close tolerances of a kernel output against the fp32 reference: the kernel rounds
    the softmax probabilities to the input dtype before the P·V product, as FlashAttention
    does, and the output to the input dtype."""
    if dtype == torch.float32:
        return {"atol": 2e-4, "rtol": 2e-4}
    if dtype == torch.float16:
        return {"atol": 4e-3, "rtol": 4e-3}
    return {"atol": 2.5e-2, "rtol": 2e-2}


def relative_tolerance(dtype: torch.dtype) -> float:
    """Bound on ||out - ref|| / ||ref||: a few roundings of the output dtype."""
    return {torch.float32: 1e-4, torch.float16: 3e-3}.get(dtype, 1e-2)


def widened(cache: torch.Tensor) -> torch.Tensor:
    """An 8-bit float cache tensor as float32 (exactly; NaN stays NaN), for comparisons torch
    does not implement on 8-bit floats; other tensors unchanged."""
    return cache.float() if cache.dtype.is_floating_point and cache.dtype.itemsize == 1 else cache


def assert_same_cache(got: LayerKVCache, expected: LayerKVCache, what: str) -> None:
    """Every tensor of ``got`` equals ``expected``'s exactly (NaN where NaN); for a turbo
    cache, as close as two roundings of the same values are (:func:`assert_close_turbo`)."""
    if turbo_ops.is_turbo(expected):
        assert_close_turbo(got, expected, what)
        return
    for name, tensor in expected.tensors.items():
        torch.testing.assert_close(
            widened(got[name]),
            widened(tensor),
            rtol=0,
            atol=0,
            equal_nan=True,
            msg=lambda m, name=name: (
                f"KV cache tensor {name!r} after the store differs ({what}): {m}"
            ),
        )


def assert_close_turbo(got: LayerKVCache, expected: LayerKVCache, what: str) -> None:
    """A turbo cache written by the kernels against the codec's reference: the kernels rotate
    with another summation order than torch, so a coordinate that lies on a rounding boundary
    may get the neighbouring code and a scale its neighbouring float16. Per-layer tensors are
    equal; scales agree to 0.2 % (NaN where NaN); decoded keys and values agree to a small
    fraction of their size (a few neighbouring codes), NaN where NaN."""
    for name in turbo_ops.PER_LAYER:
        if name in expected:
            assert torch.equal(got[name], expected[name]), f"{name} changed ({what})"
    for name in ("k_scales", "v_scales"):
        torch.testing.assert_close(
            got[name].float(),
            expected[name].float(),
            rtol=2e-3,
            atol=0,
            equal_nan=True,
            msg=lambda m, name=name: f"turbo {name} after the store differ ({what}): {m}",
        )
    blocks = torch.arange(expected.num_blocks, device=expected.device)
    got_kv, want_kv = got.codec.decode(got, blocks), expected.codec.decode(expected, blocks)
    for name, a, b in zip("kv", got_kv, want_kv):
        nan_a, nan_b = torch.isnan(a), torch.isnan(b)
        assert torch.equal(nan_a, nan_b), f"turbo {name}: written where it should not be ({what})"
        a, b = a.nan_to_num(), b.nan_to_num()
        rel = float((a - b).norm() / b.norm().clamp_min(1e-30))
        assert rel <= TURBO_CACHE_TOLERANCE, (
            f"turbo {name} after the store differs from the reference by {rel:.2e} ({what})"
        )


#: bound on ||decoded(kernel's cache) - decoded(reference cache)|| / ||decoded(reference)||
TURBO_CACHE_TOLERANCE = 0.02


def describe(case: PagedCase) -> str:
    return (
        f"seed {case.seed}, query_lens {case.query_lens}, seq_lens "
        f"{case.meta.seq_lens.tolist()}, {case.layer}, dtype {case.q.dtype}, cache "
        f"{case.kv_cache!r}"
    )


def run_and_check(case: PagedCase, backend: object) -> torch.Tensor:
    """Run ``backend.forward`` on ``case``; assert the cache matches the codec's reference
    store (:func:`assert_same_cache`) and the output rows match the torch reference run over
    the cache the kernels wrote. Returns the output. Failures name the case's seed, query and
    context lengths.

    The reference attends over the kernels' own cache, not over its own store: a turbo store
    may put a coordinate on a rounding boundary onto the neighbouring code (the rotation sums
    in another order), which the store check allows; at 3 bits one code is a large step, and
    under a short sliding window a few keys carry all the weight, so comparing against the
    reference's own store would count that rounding a second time, in the output."""
    expected_cache = case.expected_cache()
    out = backend.forward(
        case.layer,
        case.q,
        case.k,
        case.v,
        case.kv_cache,  # type: ignore[attr-defined]
        case.meta,
    )
    what = describe(case)
    assert_same_cache(case.kv_cache, expected_cache, what)
    # a turbo cache: the query and the output also pass through the rotation, rounded to the
    # activations' dtype on the way
    scale = 2.0 if turbo_ops.is_turbo(case.kv_cache) else 1.0
    check_output(
        out[: case.valid_rows], case.reference_output(case.kv_cache), case.q.dtype, what, scale
    )
    return out


def check_output(
    got: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, what: str, scale: float = 1.0
) -> None:
    """Attention output rows against the reference's: no NaN, within the tolerances of
    ``dtype`` (times ``scale``), and a bounded error relative to the whole output."""
    if torch.isnan(got).any():
        bad = torch.isnan(got).any(-1).any(-1).nonzero().flatten().tolist()
        raise AssertionError(
            f"NaN in output rows {bad[:20]} ({what}): a read outside the "
            "sequence's blocks or of masked tokens"
        )
    tol = {key: value * scale for key, value in tolerance(dtype).items()}
    torch.testing.assert_close(
        got, expected, **tol, msg=lambda m: f"attention output differs ({what}): {m}"
    )
    # Outputs over long contexts are small averages: also bound the error relative to them.
    ref = expected.float()
    rel = float((got.float() - ref).norm() / ref.norm().clamp_min(1e-30))
    assert rel <= relative_tolerance(dtype) * scale, (
        f"relative error {rel:.2e} of the attention output is too large ({what})"
    )
