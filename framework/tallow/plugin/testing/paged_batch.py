"""Random paged-attention steps and their answers by the core's torch reference.

A step is built the way the model runner builds one: sequence ``i`` has ``context_lens[i]``
tokens already in the cache and ``query_lens[i]`` new tokens whose K/V the backend stores this
step. Blocks are drawn at random from the pool, so block tables are not contiguous; sequences
may share their first full blocks (a prefix-cache hit). The cache is a KV codec's
(:class:`tallow.kernels.kv_cache.LayerKVCache`), the earlier tokens stored through the codec's
reference ``encode``; every paged element no sequence owns is NaN (0xFF bytes where the dtype
has no NaN), so a backend that reads a wrong block or a masked token gives NaN or garbage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import torch

from tallow.kernels.attention_ref import paged_attention_ref
from tallow.kernels.kv_cache import LayerKVCache, allocate_layer, indexable
from tallow.kernels.kv_cast import CastKVCodec
from tallow.layers import AttentionLayer, AttentionMetadata

from ..components import AttentionBackend, KVCodec


@dataclass
class PagedStep:
    """One layer's inputs for one step, the cache it writes into, and the metadata."""

    layer: AttentionLayer
    q: torch.Tensor  # [T, Hq, D]
    k: torch.Tensor  # [T, Hkv, D]
    v: torch.Tensor
    kv_cache: LayerKVCache
    meta: AttentionMetadata
    #: query rows that belong to a sequence (trailing padding rows, slot -1, excluded)
    valid_rows: int
    description: str = ""

    def expected_cache(self) -> LayerKVCache:
        """The cache after this step's store by the codec's reference ``encode``."""
        cache = self.kv_cache.clone()
        cache.codec.encode(cache, self.k, self.v, self.meta.slot_mapping)
        return cache

    def reference_output(self, cache: LayerKVCache) -> torch.Tensor:
        """The output rows ``[valid_rows, Hq, D]`` by the torch reference over ``cache``
        (read through its codec's ``decode``)."""
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
        """(output rows, cache after the store) by the torch reference."""
        cache = self.expected_cache()
        return self.reference_output(cache), cache


def poison_fill(tensor: torch.Tensor) -> None:
    """Fill ``tensor`` with NaN, or with 0xFF bytes where its dtype has no NaN."""
    if tensor.dtype.is_floating_point:
        tensor.fill_(float("nan"))
    else:
        indexable(tensor).view(torch.uint8).fill_(0xFF)


def on_the_grid(
    cache: LayerKVCache, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``k``/``v`` moved onto the grid of a cache of 8-bit floats (with its per-head scales and
    key offset, when it has them), so that storing them is exact whichever way ties round
    (Triton's interpreter rounds them otherwise than a GPU); other caches: unchanged."""
    store = cache.get("k")
    if store is None or not store.dtype.is_floating_point or store.dtype.itemsize != 1:
        return k, v
    k_scale = cache["k_scale"][:, None] if "k_scale" in cache else 1.0
    v_scale = cache["v_scale"][:, None] if "v_scale" in cache else 1.0
    k_offset = cache["k_offset"] if "k_offset" in cache else 0.0
    k_grid = ((k.float() - k_offset) / k_scale).to(store.dtype).float() * k_scale + k_offset
    v_grid = (v.float() / v_scale).to(store.dtype).float() * v_scale
    return k_grid.to(k.dtype), v_grid.to(v.dtype)


def random_paged_step(
    *,
    query_lens: list[int],
    context_lens: list[int],
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 64,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    cache_dtype: torch.dtype | None = None,
    codec: KVCodec | None = None,
    device: str | torch.device = "cpu",
    shared_prefix_blocks: int = 0,
    padding_rows: int = 0,
    sliding_window: int | None = None,
    logit_softcap: float | None = None,
    seed: int = 0,
    causal: bool = True,
    sinks: torch.Tensor | None = None,
    attention_chunk_size: int | None = None,
) -> PagedStep:
    """A random step (see the module docstring). The cache is ``codec``'s, or a cast into
    ``cache_dtype`` (default: ``dtype``). ``shared_prefix_blocks`` full blocks at the start of
    sequence 0 are also the first blocks of every other sequence (each needs at least that
    much context). ``padding_rows`` extra query rows belong to no sequence. ``causal`` False:
    a bidirectional (encoder) layer, whose sequences come whole (no context). ``sinks``
    [num_heads] float32: the layer's attention sinks (on ``device``).
    ``attention_chunk_size``: chunked local attention (each query over its own chunk)."""
    if len(query_lens) != len(context_lens):
        raise ValueError("query_lens and context_lens must have the same length")
    shared_tokens = shared_prefix_blocks * block_size
    if shared_prefix_blocks and min(context_lens) < shared_tokens:
        raise ValueError(
            f"every sequence needs {shared_tokens} context tokens to share "
            f"{shared_prefix_blocks} blocks, got context_lens {context_lens}"
        )
    gen = torch.Generator().manual_seed(seed)
    codec = codec if codec is not None else CastKVCodec(storage=cache_dtype or dtype)
    seq_lens = [c + n for c, n in zip(context_lens, query_lens)]
    blocks_per_seq = [-(-s // block_size) for s in seq_lens]
    own = [n - (shared_prefix_blocks if i else 0) for i, n in enumerate(blocks_per_seq)]
    num_blocks = sum(own) + 3  # a poisoned block for unused table entries, two spare
    pool = torch.randperm(num_blocks, generator=gen).tolist()
    poison = pool.pop()
    tables = torch.full((len(seq_lens), max(blocks_per_seq + [1])), poison, dtype=torch.int32)
    for i, n in enumerate(blocks_per_seq):
        start = shared_prefix_blocks if i else 0
        if start:
            tables[i, :start] = tables[0, :start]
        tables[i, start:n] = torch.tensor([pool.pop() for _ in range(n - start)], dtype=torch.int32)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    layer = AttentionLayer(
        layer_index=0,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        scale=head_dim**-0.5,
        sliding_window=sliding_window,
        logit_softcap=logit_softcap,
        causal=causal,
        sinks=None if sinks is None else sinks.float().to(device),
        attention_chunk_size=attention_chunk_size,
    )
    cache = allocate_layer(
        codec,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        num_blocks=num_blocks,
        model_dtype=dtype,
        layer=layer,
    )
    for tensor in cache.paged():
        poison_fill(tensor)
    context_slots: list[int] = []
    slots: list[int] = []
    for i, (ctx, n) in enumerate(zip(context_lens, query_lens)):
        for p in range(shared_tokens if i else 0, ctx + n):
            slot = int(tables[i, p // block_size]) * block_size + p % block_size
            (context_slots if p < ctx else slots).append(slot)
    n_ctx = len(context_slots)
    codec.encode(
        cache,
        randn(n_ctx, num_kv_heads, head_dim),
        randn(n_ctx, num_kv_heads, head_dim),
        torch.tensor(context_slots, dtype=torch.int64),
    )
    valid = sum(query_lens)
    slots += [-1] * padding_rows
    q = randn(valid + padding_rows, num_heads, head_dim)
    k, v = on_the_grid(
        cache,
        randn(valid + padding_rows, num_kv_heads, head_dim),
        randn(valid + padding_rows, num_kv_heads, head_dim),
    )
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    dev = torch.device(device)
    meta = AttentionMetadata(
        num_seqs=len(seq_lens),
        num_tokens=valid + padding_rows,
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
        block_tables=tables.to(dev),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
        max_query_len=max(query_lens + [0]),
        max_seq_len=max(seq_lens + [0]),
        block_size=block_size,
        query_start_loc_cpu=starts,
        seq_lens_cpu=seq_lens,
    )
    what = (
        f"query_lens {query_lens}, context_lens {context_lens}, shared blocks "
        f"{shared_prefix_blocks}, padding {padding_rows}, {layer}, dtype {dtype}, cache "
        f"{cache!r}, seed {seed}"
    )
    cache = cache.with_tensors({n: t.to(dev) for n, t in cache.tensors.items()})
    return PagedStep(layer, q.to(dev), k.to(dev), v.to(dev), cache, meta, valid, what)


class Tolerance(TypedDict):
    """``torch.testing.assert_close``'s tolerances."""

    atol: float
    rtol: float


def output_tolerance(dtype: torch.dtype) -> Tolerance:
    """``assert_close`` tolerances of a backend's output against the float32 reference: a
    kernel may round the softmax probabilities and the output to the activations' dtype."""
    if dtype == torch.float32:
        return {"atol": 2e-4, "rtol": 2e-4}
    if dtype == torch.float16:
        return {"atol": 4e-3, "rtol": 4e-3}
    return {"atol": 2.5e-2, "rtol": 2e-2}


def widened(tensor: torch.Tensor) -> torch.Tensor:
    """An 8-bit float tensor as float32 (exactly; NaN stays NaN), for comparisons torch does
    not implement on 8-bit floats; others unchanged."""
    return (
        tensor.float() if tensor.dtype.is_floating_point and tensor.dtype.itemsize == 1 else tensor
    )


def assert_same_cache(got: LayerKVCache, expected: LayerKVCache, what: str) -> None:
    """Every tensor of ``got`` equals ``expected``'s exactly (NaN where NaN)."""
    for name, tensor in expected.tensors.items():

        def message(m: str, name: str = name) -> str:
            return f"KV cache tensor {name!r} after the store differs ({what}): {m}"

        torch.testing.assert_close(
            widened(got[name]).cpu(),
            widened(tensor).cpu(),
            rtol=0,
            atol=0,
            equal_nan=True,
            msg=message,
        )


def assert_close_decoded(
    got: LayerKVCache, expected: LayerKVCache, tolerance: float, what: str
) -> None:
    """The K and V ``got`` decodes to are within ``tolerance`` of ``expected``'s
    (``||got - expected|| / ||expected||`` over the whole cache), NaN exactly where
    ``expected`` has NaN (nothing written where nothing should be); per-layer tensors equal.
    For a backend whose fused store rounds otherwise than the codec's reference (another
    summation order puts a value on the other side of a rounding boundary)."""
    for spec in expected.layout:
        if not spec.per_block:
            assert torch.equal(got[spec.name].cpu(), expected[spec.name].cpu()), (
                f"the store changed the per-layer tensor {spec.name!r} ({what})"
            )
    blocks = torch.arange(expected.num_blocks, device=expected.device)
    for name, a, b in zip(
        "KV", got.codec.decode(got, blocks), expected.codec.decode(expected, blocks)
    ):
        assert torch.equal(torch.isnan(a), torch.isnan(b)), (
            f"{name}: the store wrote where the reference did not, or missed a slot ({what})"
        )
        a, b = a.nan_to_num(), b.nan_to_num()
        rel = float((a - b).norm() / b.norm().clamp_min(1e-30))
        assert rel <= tolerance, (
            f"{name} after the store differs from the codec's reference "
            f"by {rel:.2e} (relative), more than {tolerance} ({what})"
        )


def check_step(
    step: PagedStep,
    backend: AttentionBackend,
    store_tolerance: float | None = None,
    output_scale: float = 1.0,
) -> torch.Tensor:
    """Run ``backend.forward`` on ``step``. The cache after it must equal the codec's reference
    store exactly (NaN where nothing was written), or, with ``store_tolerance``, decode to
    within it (:func:`assert_close_decoded`). The output rows must match the torch reference
    run over the backend's own cache (so that a store's rounding does not count twice), to
    :func:`output_tolerance` times ``output_scale``. Returns the output."""
    expected_cache = step.expected_cache()
    out = backend.forward(step.layer, step.q, step.k, step.v, step.kv_cache, step.meta)
    assert tuple(out.shape) == tuple(step.q.shape), (
        f"output shape {tuple(out.shape)}, expected {tuple(step.q.shape)} ({step.description})"
    )
    if store_tolerance is None:
        assert_same_cache(step.kv_cache, expected_cache, step.description)
    else:
        assert_close_decoded(step.kv_cache, expected_cache, store_tolerance, step.description)
    got = out[: step.valid_rows].cpu()
    if torch.isnan(got).any():
        rows = torch.isnan(got).any(-1).any(-1).nonzero().flatten().tolist()
        raise AssertionError(
            f"NaN in output rows {rows[:20]} ({step.description}): a read "
            "outside the sequence's blocks or of masked tokens"
        )
    expected_out = step.reference_output(step.kv_cache).cpu()
    base = output_tolerance(step.q.dtype)
    tol = Tolerance(atol=base["atol"] * output_scale, rtol=base["rtol"] * output_scale)
    torch.testing.assert_close(
        got,
        expected_out,
        **tol,
        msg=lambda m: f"attention output differs ({step.description}): {m}",
    )
    return out
