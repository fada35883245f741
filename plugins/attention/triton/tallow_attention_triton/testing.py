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

from tallow.kernels.attention_ref import paged_attention_ref, store_kv_ref
from tallow.layers import AttentionLayer, AttentionMetadata


@dataclass
class PagedCase:
    """One step of one layer: inputs, a cache to write into, and the metadata."""

    layer: AttentionLayer
    q: torch.Tensor  # [T, Hq, D]
    k: torch.Tensor  # [T, Hkv, D]
    v: torch.Tensor
    kv_cache: torch.Tensor  # [2, blocks, block_size, Hkv, D]
    meta: AttentionMetadata
    #: rows of q that belong to a sequence (trailing padding rows excluded)
    valid_rows: int
    query_lens: list[int] = field(default_factory=list)
    seed: int = 0

    def expected(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(output rows [valid_rows, Hq, D], cache after the store), by the torch reference."""
        cache = self.kv_cache.clone()
        store_kv_ref(cache, self.k, self.v, self.meta.slot_mapping)
        out = paged_attention_ref(
            self.q[:self.valid_rows], cache,
            query_start_loc=self.meta.query_start_loc.tolist(),
            seq_lens=self.meta.seq_lens.tolist(), block_tables=self.meta.block_tables,
            scale=self.layer.scale, sliding_window=self.layer.sliding_window,
            logit_softcap=self.layer.logit_softcap, causal=self.layer.causal,
        )
        return out, cache


def make_case(*, query_lens: list[int], context_lens: list[int], num_heads: int,
              num_kv_heads: int, head_dim: int, block_size: int = 16,
              dtype: torch.dtype = torch.bfloat16, cache_dtype: torch.dtype | None = None,
              device: str | torch.device = "cpu", sliding_window: int | None = None,
              logit_softcap: float | None = None, scale: float | None = None,
              padding_rows: int = 0, spare_blocks: int = 3, num_blocks: int | None = None,
              seed: int = 0, host_copies: bool = True, causal: bool = True) -> PagedCase:
    """A random batch; ``context_lens[i]`` earlier tokens of sequence ``i`` are already cached
    and its ``query_lens[i]`` tokens are this step's (their K/V still to be stored).

    ``padding_rows`` extra query rows at the end belong to no sequence and have slot -1.
    ``num_blocks`` fixes the pool size (default: what the batch needs + ``spare_blocks``).
    ``host_copies`` False leaves ``query_start_loc_cpu``/``seq_lens_cpu`` None, as a CUDA-graph
    runner does. ``causal`` False makes a bidirectional (encoder) layer, whose sequences the
    engine always computes whole: give it context lengths of 0.
    """
    if len(query_lens) != len(context_lens):
        raise ValueError("query_lens and context_lens must have the same length")
    gen = torch.Generator().manual_seed(seed)
    cache_dtype = cache_dtype or dtype
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

    cache = torch.full((2, num_blocks, block_size, num_kv_heads, head_dim), float("nan"),
                       dtype=cache_dtype)
    slots: list[int] = []
    for i, (ctx, n) in enumerate(zip(context_lens, query_lens)):
        pos = torch.arange(ctx)
        blk = tables[i, pos // block_size].long()
        off = pos % block_size
        cache[0, blk, off] = randn(ctx, num_kv_heads, head_dim).to(cache_dtype)
        cache[1, blk, off] = randn(ctx, num_kv_heads, head_dim).to(cache_dtype)
        for p in range(ctx, ctx + n):
            slots.append(int(tables[i, p // block_size]) * block_size + p % block_size)
    n_tokens = sum(query_lens)
    slots += [-1] * padding_rows
    total = n_tokens + padding_rows
    q = randn(total, num_heads, head_dim)
    k = randn(total, num_kv_heads, head_dim)
    v = randn(total, num_kv_heads, head_dim)
    if cache_dtype.itemsize == 1:
        # This step's K/V already on the 8-bit grid: the store is then exact on the GPU and in
        # Triton's interpreter alike (which rounds ties differently); the rounding itself is
        # checked against torch on the GPU.
        k, v = k.to(cache_dtype).to(dtype), v.to(cache_dtype).to(dtype)
    qsl = [0]
    for n in query_lens:
        qsl.append(qsl[-1] + n)
    dev = torch.device(device)
    meta = AttentionMetadata(
        num_seqs=len(seq_lens), num_tokens=total,
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=dev),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
        block_tables=tables.to(dev),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
        max_query_len=max(query_lens + [0]), max_seq_len=max(seq_lens + [0]),
        block_size=block_size,
        query_start_loc_cpu=qsl if host_copies else None,
        seq_lens_cpu=seq_lens if host_copies else None,
    )
    layer = AttentionLayer(layer_index=0, num_heads=num_heads, num_kv_heads=num_kv_heads,
                           head_dim=head_dim,
                           scale=scale if scale is not None else head_dim ** -0.5,
                           sliding_window=sliding_window, logit_softcap=logit_softcap,
                           causal=causal)
    return PagedCase(layer=layer, q=q.to(dev), k=k.to(dev), v=v.to(dev),
                     kv_cache=cache.to(dev), meta=meta, valid_rows=n_tokens,
                     query_lens=list(query_lens), seed=seed)


def grow_keys(case: PagedCase, step: float = 2.0, period: int = 20) -> PagedCase:
    """Scale the cached keys of each sequence's ``j``-th block by ``1 + step * (j % period)``
    (rounded back to the cache dtype), so that attention scores keep climbing along the
    context, fall back and climb again: the running maximum of an online softmax then grows by
    large steps tile after tile, not only at the first tile as with plain random keys."""
    tables = case.meta.block_tables.cpu()
    bs = case.kv_cache.shape[2]
    keys = case.kv_cache[0].float()
    for i, seq_len in enumerate(case.meta.seq_lens.tolist()):
        for j in range(-(-seq_len // bs)):
            keys[int(tables[i, j])] *= 1.0 + step * (j % period)
    case.kv_cache[0] = keys.to(case.kv_cache.dtype)
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
    """An 8-bit float cache as float32 (exactly; NaN stays NaN), for comparisons torch does
    not implement on 8-bit floats; other caches unchanged."""
    return cache.float() if cache.dtype.itemsize == 1 else cache


def run_and_check(case: PagedCase, backend: object) -> torch.Tensor:
    """Run ``backend.forward`` on ``case`` and assert the cache and the output rows match the
    torch reference (the cache exactly, NaN where nothing was written). Returns the output.
    Failures name the case's seed, query and context lengths."""
    expected_out, expected_cache = case.expected()
    out = backend.forward(case.layer, case.q, case.k, case.v, case.kv_cache,  # type: ignore[attr-defined]
                          case.meta)
    what = (f"seed {case.seed}, query_lens {case.query_lens}, seq_lens "
            f"{case.meta.seq_lens.tolist()}, {case.layer}, dtype {case.q.dtype}, cache "
            f"{case.kv_cache.dtype}")
    torch.testing.assert_close(widened(case.kv_cache), widened(expected_cache), rtol=0, atol=0,
                               equal_nan=True,
                               msg=lambda m: f"KV cache after the store differs ({what}): {m}")
    got = out[:case.valid_rows]
    if torch.isnan(got).any():
        bad = torch.isnan(got).any(-1).any(-1).nonzero().flatten().tolist()
        raise AssertionError(f"NaN in output rows {bad[:20]} ({what}): a read outside the "
                             "sequence's blocks or of masked tokens")
    torch.testing.assert_close(got, expected_out, **tolerance(case.q.dtype),
                               msg=lambda m: f"attention output differs ({what}): {m}")
    # Outputs over long contexts are small averages: also bound the error relative to them.
    ref = expected_out.float()
    rel = float((got.float() - ref).norm() / ref.norm().clamp_min(1e-30))
    assert rel <= relative_tolerance(case.q.dtype), \
        f"relative error {rel:.2e} of the attention output is too large ({what})"
    return out
