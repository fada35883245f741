"""Random paged-attention steps and their answers by the core's torch reference.

A step is built the way the model runner builds one: sequence ``i`` has ``context_lens[i]``
tokens already in the cache and ``query_lens[i]`` new tokens whose K/V the backend stores this
step. Blocks are drawn at random from the pool, so block tables are not contiguous; sequences
may share their first full blocks (a prefix-cache hit). Every cache element no sequence owns
is NaN, so a backend that reads a wrong block or a masked token gives NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tallow.kernels.attention_ref import paged_attention_ref, store_kv_ref
from tallow.layers import AttentionLayer, AttentionMetadata


@dataclass
class PagedStep:
    """One layer's inputs for one step, the cache it writes into, and the metadata."""

    layer: AttentionLayer
    q: torch.Tensor  # [T, Hq, D]
    k: torch.Tensor  # [T, Hkv, D]
    v: torch.Tensor
    kv_cache: torch.Tensor  # [2, blocks, block_size, Hkv, D]
    meta: AttentionMetadata
    #: query rows that belong to a sequence (trailing padding rows, slot -1, excluded)
    valid_rows: int
    description: str = ""

    def expected(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(output rows ``[valid_rows, Hq, D]``, cache after the store) by the torch
        reference."""
        cache = self.kv_cache.clone()
        store_kv_ref(cache, self.k, self.v, self.meta.slot_mapping)
        out = paged_attention_ref(
            self.q[:self.valid_rows], cache, query_start_loc=self.meta.query_start_loc.tolist(),
            seq_lens=self.meta.seq_lens.tolist(), block_tables=self.meta.block_tables,
            scale=self.layer.scale, sliding_window=self.layer.sliding_window,
            logit_softcap=self.layer.logit_softcap, causal=self.layer.causal)
        return out, cache


def random_paged_step(*, query_lens: list[int], context_lens: list[int], num_heads: int = 4,
                      num_kv_heads: int = 2, head_dim: int = 64, block_size: int = 16,
                      dtype: torch.dtype = torch.float32, cache_dtype: torch.dtype | None = None,
                      device: str | torch.device = "cpu", shared_prefix_blocks: int = 0,
                      padding_rows: int = 0, sliding_window: int | None = None,
                      logit_softcap: float | None = None, seed: int = 0,
                      causal: bool = True) -> PagedStep:
    """A random step (see the module docstring). ``shared_prefix_blocks`` full blocks at the
    start of sequence 0 are also the first blocks of every other sequence (each needs at least
    that much context). ``padding_rows`` extra query rows belong to no sequence. ``causal``
    False: a bidirectional (encoder) layer, whose sequences come whole (no context)."""
    if len(query_lens) != len(context_lens):
        raise ValueError("query_lens and context_lens must have the same length")
    shared_tokens = shared_prefix_blocks * block_size
    if shared_prefix_blocks and min(context_lens) < shared_tokens:
        raise ValueError(f"every sequence needs {shared_tokens} context tokens to share "
                         f"{shared_prefix_blocks} blocks, got context_lens {context_lens}")
    gen = torch.Generator().manual_seed(seed)
    cache_dtype = cache_dtype or dtype
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
        tables[i, start:n] = torch.tensor([pool.pop() for _ in range(n - start)],
                                          dtype=torch.int32)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    cache = torch.full((2, num_blocks, block_size, num_kv_heads, head_dim), float("nan"),
                       dtype=cache_dtype)
    slots: list[int] = []
    for i, (ctx, n) in enumerate(zip(context_lens, query_lens)):
        pos = torch.arange(shared_tokens if i else 0, ctx)
        blk, off = tables[i, pos // block_size].long(), pos % block_size
        for side in (0, 1):
            cache[side, blk, off] = randn(len(pos), num_kv_heads, head_dim).to(cache_dtype)
        slots += [int(tables[i, p // block_size]) * block_size + p % block_size
                  for p in range(ctx, ctx + n)]
    valid = sum(query_lens)
    slots += [-1] * padding_rows
    q = randn(valid + padding_rows, num_heads, head_dim)
    k = randn(valid + padding_rows, num_kv_heads, head_dim)
    v = randn(valid + padding_rows, num_kv_heads, head_dim)
    if cache_dtype.itemsize == 1:
        # this step's K/V already on the 8-bit grid: rounding ties is the codec's business
        # (checked by the KV codec suite), not the backend's
        k, v = k.to(cache_dtype).to(dtype), v.to(cache_dtype).to(dtype)
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    dev = torch.device(device)
    meta = AttentionMetadata(
        num_seqs=len(seq_lens), num_tokens=valid + padding_rows,
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=dev),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
        block_tables=tables.to(dev), slot_mapping=torch.tensor(slots, dtype=torch.int64,
                                                               device=dev),
        max_query_len=max(query_lens + [0]), max_seq_len=max(seq_lens + [0]),
        block_size=block_size, query_start_loc_cpu=starts, seq_lens_cpu=seq_lens)
    layer = AttentionLayer(layer_index=0, num_heads=num_heads, num_kv_heads=num_kv_heads,
                           head_dim=head_dim, scale=head_dim ** -0.5,
                           sliding_window=sliding_window, logit_softcap=logit_softcap,
                           causal=causal)
    what = (f"query_lens {query_lens}, context_lens {context_lens}, shared blocks "
            f"{shared_prefix_blocks}, padding {padding_rows}, {layer}, dtype {dtype}, cache "
            f"{cache_dtype}, seed {seed}")
    return PagedStep(layer, q.to(dev), k.to(dev), v.to(dev), cache.to(dev), meta, valid, what)


def output_tolerance(dtype: torch.dtype) -> dict[str, float]:
    """``assert_close`` tolerances of a backend's output against the float32 reference: a
    kernel may round the softmax probabilities and the output to the activations' dtype."""
    if dtype == torch.float32:
        return {"atol": 2e-4, "rtol": 2e-4}
    if dtype == torch.float16:
        return {"atol": 4e-3, "rtol": 4e-3}
    return {"atol": 2.5e-2, "rtol": 2e-2}


def widened(cache: torch.Tensor) -> torch.Tensor:
    """An 8-bit float cache as float32 (exactly; NaN stays NaN), for comparisons torch does
    not implement on 8-bit floats."""
    return cache.float() if cache.dtype.itemsize == 1 else cache


def check_step(step: PagedStep, backend: object) -> torch.Tensor:
    """Run ``backend.forward`` on ``step``; assert the cache equals the reference's exactly (NaN
    where nothing was written) and the output rows are close to it. Returns the output."""
    expected_out, expected_cache = step.expected()
    out = backend.forward(step.layer, step.q, step.k, step.v,  # type: ignore[attr-defined]
                          step.kv_cache, step.meta)
    assert tuple(out.shape) == tuple(step.q.shape), (
        f"output shape {tuple(out.shape)}, expected {tuple(step.q.shape)} ({step.description})")
    torch.testing.assert_close(
        widened(step.kv_cache).cpu(), widened(expected_cache).cpu(), rtol=0, atol=0,
        equal_nan=True, msg=lambda m: f"KV cache after the store differs ({step.description}): "
                                      f"{m}")
    got = out[:step.valid_rows].cpu()
    if torch.isnan(got).any():
        rows = torch.isnan(got).any(-1).any(-1).nonzero().flatten().tolist()
        raise AssertionError(f"NaN in output rows {rows[:20]} ({step.description}): a read "
                             "outside the sequence's blocks or of masked tokens")
    torch.testing.assert_close(got, expected_out.cpu(), **output_tolerance(step.q.dtype),
                               msg=lambda m: f"attention output differs ({step.description}): "
                                             f"{m}")
    return out
