"""A random latent attention (MLA) step over a paged latent cache, and the check of a
backend's :meth:`~tallow.plugin.AttentionBackend.forward_mla` against the core's reference
(:func:`tallow.kernels.mla_attention_ref`): the stored rows bit for bit, the output within
the activations' rounding."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from tallow.kernels import mla_attention_ref, store_latent_ref
from tallow.layers import AttentionMetadata, MLALayer

from ..components import AttentionBackend

__all__ = ["MLAStep", "random_mla_step", "check_mla_step"]


@dataclass
class MLAStep:
    """One step: the layer, its inputs, the cache before the store, the metadata."""

    layer: MLALayer
    q_nope: torch.Tensor
    q_pe: torch.Tensor
    latent: torch.Tensor
    w_uk: torch.Tensor
    w_uv: torch.Tensor
    cache: torch.Tensor
    meta: AttentionMetadata
    #: sequences of the step (padding rows come after them)
    num_real: int


def random_mla_step(
    *,
    query_lens: list[int],
    context_lens: list[int],
    num_heads: int = 4,
    kv_lora_rank: int = 64,
    rope: int = 16,
    nope: int = 32,
    v_dim: int = 32,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
    cache_dtype: torch.dtype | None = None,
    device: str = "cpu",
    padding_rows: int = 0,
    seed: int = 0,
) -> MLAStep:
    """Sequences with ``context_lens`` rows already cached (in shuffled blocks) and
    ``query_lens`` new rows each, plus ``padding_rows`` rows of slot -1. ``cache_dtype``
    (default ``dtype``): an 8-bit float cache gets new rows already on its grid, so that a
    kernel's conversion and torch's agree whatever their rounding of in-between values (the
    Triton interpreter rounds a value just below a power of two down)."""
    gen = torch.Generator().manual_seed(seed)
    width = kv_lora_rank + rope
    totals = [c + q for c, q in zip(context_lens, query_lens)]
    per_seq = [-(-t // block_size) for t in totals]
    blocks = list(range(sum(per_seq) + 1))
    random.Random(seed).shuffle(blocks)
    cache_dtype = cache_dtype or dtype
    cache = torch.zeros(len(blocks), block_size, width, dtype=cache_dtype)
    tables = torch.zeros(len(totals) + padding_rows, max(per_seq), dtype=torch.int32)
    slots: list[int] = []
    starts = [0]
    at = 0
    for i, (ctx, n_q) in enumerate(zip(context_lens, query_lens)):
        own = blocks[at : at + per_seq[i]]
        at += per_seq[i]
        tables[i, : len(own)] = torch.tensor(own, dtype=torch.int32)
        where = [own[p // block_size] * block_size + p % block_size for p in range(ctx + n_q)]
        store_latent_ref(
            cache,
            torch.randn(ctx, width, generator=gen),
            torch.tensor(where[:ctx], dtype=torch.int64),
        )
        slots += where[ctx:]
        starts.append(starts[-1] + n_q)
    starts += [starts[-1] + j + 1 for j in range(padding_rows)]
    slots += [-1] * padding_rows
    lens = totals + [1] * padding_rows
    n = starts[-1]
    layer = MLALayer(0, num_heads, kv_lora_rank, nope, rope, v_dim, (nope + rope) ** -0.5)

    def rand(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(device)

    meta = AttentionMetadata(
        num_seqs=len(lens),
        num_tokens=n,
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(lens, dtype=torch.int32, device=device),
        block_tables=tables.to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        max_query_len=max(b - a for a, b in zip(starts, starts[1:])),
        max_seq_len=max(lens),
        block_size=block_size,
        query_start_loc_cpu=starts,
        seq_lens_cpu=lens,
    )
    latent = torch.randn(n, width, generator=gen)
    if cache_dtype.itemsize == 1:
        latent = latent.to(cache_dtype).float()
    return MLAStep(
        layer,
        rand(n, num_heads, nope),
        rand(n, num_heads, rope),
        latent.to(dtype).to(device),
        rand(num_heads, nope, kv_lora_rank, scale=kv_lora_rank**-0.5),
        rand(num_heads, v_dim, kv_lora_rank, scale=kv_lora_rank**-0.5),
        cache.to(device),
        meta,
        len(query_lens),
    )


def check_mla_step(step: MLAStep, backend: AttentionBackend, what: str = "") -> torch.Tensor:
    """Run ``backend.forward_mla`` on ``step`` and compare with the reference (``what``
    names the case in failures); returns the backend's output."""
    ref_cache = step.cache.clone()
    store_latent_ref(ref_cache, step.latent, step.meta.slot_mapping)
    real = step.num_real
    qsl, lens = step.meta.query_start_loc_cpu, step.meta.seq_lens_cpu
    assert qsl is not None and lens is not None
    ref = mla_attention_ref(
        step.q_nope,
        step.q_pe,
        ref_cache,
        w_uk=step.w_uk,
        w_uv=step.w_uv,
        query_start_loc=qsl[: real + 1],
        seq_lens=lens[:real],
        block_tables=step.meta.block_tables,
        scale=step.layer.scale,
    )
    cache = step.cache.clone()
    out = backend.forward_mla(
        step.layer, step.q_nope, step.q_pe, step.latent, cache, step.w_uk, step.w_uv, step.meta
    )

    def raw(t: torch.Tensor) -> torch.Tensor:
        return t.view(torch.uint8) if t.element_size() == 1 else t

    assert torch.equal(raw(cache), raw(ref_cache)), (
        "the latent cache after the store differs from store_latent_ref's (or a padding row "
        "was stored)"
    )
    n = qsl[real]
    assert tuple(out.shape) == tuple(ref.shape), (
        f"output {list(out.shape)}, expected {list(ref.shape)}"
    )
    tol = 1e-4 if step.q_nope.dtype == torch.float32 else 3e-2
    torch.testing.assert_close(
        out[:n].float(), ref[:n].float(), rtol=tol, atol=tol, msg=lambda m: f"{what}: {m}"
    )
    return out
