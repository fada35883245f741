"""The latent attention (MLA) reference: the absorbed and expanded forms agree with a dense
attention over explicitly expanded keys and values, over a paged cache, across prefix-cached
and chunked sequences, in 16-bit and float8 caches; the layer through the torch backend."""

from __future__ import annotations

import pytest
import torch

from tallow.kernels import (
    absorb_queries,
    attention_ref,
    mla_absorbed_ref,
    mla_attention_ref,
    mla_expanded_ref,
    store_latent_ref,
)
from tallow.kernels.kv_cast import AutoKVCodec, CastKVCodec
from tallow.layers import AttentionMetadata, MLAAttention, forward_context
from tallow.layers.torch_attention import TorchAttentionBackend
from tallow.plugin import AttentionBackend

H, DN, DR, DV, R = 4, 16, 8, 12, 32
W = R + DR


def _weights(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randn(H, DN, R, generator=gen) * 0.2, torch.randn(H, DV, R, generator=gen) * 0.2)


def _dense(q_nope, q_pe, latent, w_uk, w_uv, scale):
    """K/V expanded by hand, then the core's dense attention reference."""
    c, k_pe = latent[:, :R], latent[:, R:]
    k = torch.cat(
        [torch.einsum("sr,hnr->shn", c, w_uk), k_pe[:, None, :].expand(-1, H, -1)], dim=-1
    )
    v = torch.einsum("sr,hvr->shv", c, w_uv)
    q = torch.cat([q_nope, q_pe], dim=-1)
    # attention_ref needs one head size: pad v to the q/k size, cut the output back
    pad = torch.zeros(v.shape[0], H, q.shape[-1] - DV)
    out = attention_ref(q, k, torch.cat([v, pad], dim=-1), scale=scale, context_len=latent.shape[0])
    return out[..., :DV]


@pytest.mark.parametrize("n_q", [1, 5])
def test_absorbed_and_expanded_forms_equal_dense_attention(n_q):
    gen = torch.Generator().manual_seed(n_q)
    w_uk, w_uv = _weights(gen)
    latent = torch.randn(9, W, generator=gen)
    q_nope, q_pe = torch.randn(n_q, H, DN, generator=gen), torch.randn(n_q, H, DR, generator=gen)
    ref = _dense(q_nope, q_pe, latent, w_uk, w_uv, 0.3)
    for form in (mla_absorbed_ref, mla_expanded_ref):
        out = form(q_nope, q_pe, latent, w_uk, w_uv, scale=0.3)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    q_lat = absorb_queries(q_nope, w_uk)
    assert q_lat.shape == (n_q, H, R)
    torch.testing.assert_close(q_lat, torch.einsum("qhn,hnr->qhr", q_nope, w_uk))


def _paged_batch(gen, dtype, seqs, block_size=4, blocks=24):
    """A cache holding each sequence's earlier rows, and the step's new rows stored through
    ``store_latent_ref`` (with a padding row of slot -1)."""
    cache = torch.zeros(blocks, block_size, W, dtype=dtype)
    tables, starts, lens, slots, new_rows, full = [], [0], [], [], [], []
    next_block = 0
    for cached, new in seqs:
        total = cached + new
        n_blocks = -(-total // block_size)
        table = list(range(next_block + n_blocks - 1, next_block - 1, -1))  # not in order
        next_block += n_blocks
        rows = torch.randn(total, W, generator=gen)
        full.append(rows)
        for pos in range(total):
            slot = table[pos // block_size] * block_size + pos % block_size
            if pos < cached:
                cache.view(-1, W)[slot] = rows[pos].to(dtype)
            else:
                slots.append(slot)
                new_rows.append(rows[pos])
        tables.append(table + [0] * (6 - len(table)))
        starts.append(starts[-1] + new)
        lens.append(total)
    slots.append(-1)
    new_rows.append(torch.full((W,), 1e4))  # padding: must not be stored
    store_latent_ref(cache, torch.stack(new_rows), torch.tensor(slots))
    return cache, torch.tensor(tables, dtype=torch.int32), starts, lens, full


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_paged_batch_of_prefix_cached_chunks_and_decodes(dtype):
    """Sequences with earlier rows in the cache (a prefix hit, a previous chunk), a whole
    prompt and single-query decodes, in one step, in cache blocks out of order."""
    gen = torch.Generator().manual_seed(7)
    w_uk, w_uv = _weights(gen)
    seqs = [(8, 3), (0, 6), (13, 1), (5, 1)]
    cache, tables, starts, lens, full = _paged_batch(gen, dtype, seqs)
    n = starts[-1]
    q_nope, q_pe = torch.randn(n, H, DN, generator=gen), torch.randn(n, H, DR, generator=gen)
    out = mla_attention_ref(
        q_nope,
        q_pe,
        cache,
        w_uk=w_uk,
        w_uv=w_uv,
        query_start_loc=starts,
        seq_lens=lens,
        block_tables=tables,
        scale=0.25,
    )
    for i, rows in enumerate(full):
        rows = rows.to(dtype).float()  # what the cache holds
        s, e = starts[i], starts[i + 1]
        ref = _dense(q_nope[s:e], q_pe[s:e], rows, w_uk, w_uv, 0.25)
        torch.testing.assert_close(out[s:e], ref, rtol=1e-4, atol=1e-4)
    # both forms for every sequence give the same step
    for absorbed in (True, False):
        other = mla_attention_ref(
            q_nope,
            q_pe,
            cache,
            w_uk=w_uk,
            w_uv=w_uv,
            query_start_loc=starts,
            seq_lens=lens,
            block_tables=tables,
            scale=0.25,
            absorbed=absorbed,
        )
        torch.testing.assert_close(other, out, rtol=1e-4, atol=1e-4)


def test_store_skips_padding_and_saturates_float8():
    cache = torch.zeros(2, 4, W, dtype=torch.float8_e4m3fn)
    rows = torch.full((3, W), 1000.0)
    store_latent_ref(cache, rows, torch.tensor([1, -1, 6]))
    flat = cache.view(-1, W).float()
    assert flat[1].eq(448.0).all() and flat[6].eq(448.0).all()  # e4m3's largest finite value
    assert flat[[0, 2, 3, 4, 5, 7]].eq(0).all()
    with pytest.raises(ValueError, match=r"latent cache must be \[num_blocks, block_size, 40\]"):
        store_latent_ref(torch.zeros(2, 4, 7), rows, torch.tensor([0, 1, 2]))


def test_codecs_choose_the_latent_dtype():
    assert AutoKVCodec().latent_dtype(torch.bfloat16) is torch.bfloat16
    assert (
        CastKVCodec(storage=torch.float8_e4m3fn).latent_dtype(torch.bfloat16) is torch.float8_e4m3fn
    )


def _meta(starts, lens, tables, slots):
    return AttentionMetadata(
        num_seqs=len(lens),
        num_tokens=starts[-1],
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        block_tables=tables,
        slot_mapping=torch.tensor(slots),
        max_query_len=max(b - a for a, b in zip(starts, starts[1:])),
        max_seq_len=max(lens),
        block_size=4,
        query_start_loc_cpu=starts,
        seq_lens_cpu=lens,
    )


def test_layer_runs_through_the_torch_backend_and_checks_its_inputs():
    """Prefill then decode of one sequence through MLAAttention: the decode step (absorbed)
    equals the last row of the whole sequence computed at once (expanded)."""
    gen = torch.Generator().manual_seed(3)
    layer = MLAAttention(
        0, H, kv_lora_rank=R, qk_nope_head_dim=DN, qk_rope_head_dim=DR, v_head_dim=DV, scale=0.2
    )
    assert layer.cache_spec().width == W
    w_uk, w_uv = _weights(gen)
    weight = torch.cat([w_uk, w_uv], dim=1).reshape(H * (DN + DV), R)
    kv_b = torch.nn.Linear(R, H * (DN + DV), bias=False)
    with torch.no_grad():
        kv_b.weight.copy_(weight)
    layer.absorb(kv_b)
    torch.testing.assert_close(layer.w_uk, w_uk)
    torch.testing.assert_close(layer.w_uv, w_uv)
    with pytest.raises(ValueError, match="latent cache must be a tensor"):
        layer.bind_cache(torch.zeros(4, 4, W + 1), 0)
    layer.bind_cache(torch.zeros(4, 4, W), 0)
    q = torch.randn(7, H * (DN + DR), generator=gen)
    latent = torch.randn(7, W, generator=gen)
    table = torch.tensor([[2, 0]], dtype=torch.int32)
    slots = [table[0, p // 4].item() * 4 + p % 4 for p in range(7)]
    backend = TorchAttentionBackend()
    with forward_context(_meta([0, 6], [6], table, slots[:6]), backend):
        first = layer(q[:6], latent[:6])
    with forward_context(_meta([0, 1], [7], table, slots[6:]), backend):
        step = layer(q[6:], latent[6:])
    whole = mla_expanded_ref(
        q.view(7, H, -1)[..., :DN], q.view(7, H, -1)[..., DN:], latent, w_uk, w_uv, scale=0.2
    ).reshape(7, -1)
    torch.testing.assert_close(first, whole[:6], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(step, whole[6:], rtol=1e-5, atol=1e-5)

    class NoLatent(AttentionBackend):
        name = "plain"

    with forward_context(_meta([0, 1], [7], table, slots[6:]), NoLatent()):
        with pytest.raises(RuntimeError, match="no latent attention"):
            layer(q[6:], latent[6:])
    with pytest.raises(ValueError, match=r"kv_b_proj weight must be \[112, 32\]"):
        layer.set_up_projection(torch.zeros(3, R))
