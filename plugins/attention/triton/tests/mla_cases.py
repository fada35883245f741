"""Latent attention (MLA) cases that check the Triton kernels against the core's torch
reference.

Not collected on its own (no ``test_`` prefix): ``test_mla_interpret.py`` runs it with
``TRITON_INTERPRET=1`` (CPU), and on a CUDA machine ``python -m pytest
plugins/attention/triton/tests/mla_cases.py`` runs it on the GPU (also at DeepSeek's own widths).
"""

from __future__ import annotations

import os
import random
import zlib

import pytest
import torch

from tallow.kernels import mla_attention_ref, store_latent_ref
from tallow.layers import AttentionMetadata, MLALayer
from tallow_attention_triton import mla_ops, ops
from tallow_attention_triton.backend import TritonAttentionBackend

if ops.interpreting():
    DEVICE = "cpu"
elif torch.cuda.is_available():
    DEVICE = "cuda"
else:
    pytest.skip("needs a CUDA GPU or TRITON_INTERPRET=1 set before triton is imported "
                "(test_mla_interpret.py runs this module that way)", allow_module_level=True)

#: fresh inputs every run; set TALLOW_TEST_SEED to replay one
BASE_SEED = int(os.environ.get("TALLOW_TEST_SEED") or random.SystemRandom().randrange(2**31))


def seed_of(*parts: object) -> int:
    return (zlib.crc32(repr(parts).encode()) ^ BASE_SEED) % (2**31)


def _case(seed, *, heads, rank, rope, nope, v_dim, query_lens, context_lens, block_size,
          dtype, cache_dtype, padding=0):
    """A batch over a shuffled paged latent cache: earlier rows already stored, this step's
    rows to store, plus ``padding`` rows of slot -1 (a CUDA graph's padded batch)."""
    gen = torch.Generator().manual_seed(seed)
    width = rank + rope
    total = [c + q for c, q in zip(context_lens, query_lens)]
    per_seq = [-(-t // block_size) for t in total]
    blocks = list(range(sum(per_seq) + 2))
    random.Random(seed).shuffle(blocks)
    cache = torch.zeros(len(blocks), block_size, width, dtype=cache_dtype)
    tables = torch.zeros(len(total), max(per_seq), dtype=torch.int32)
    slots, new_rows, starts = [], [], [0]
    at = 0
    for i, (ctx, n_q) in enumerate(zip(context_lens, query_lens)):
        own = blocks[at:at + per_seq[i]]
        at += per_seq[i]
        tables[i, :len(own)] = torch.tensor(own, dtype=torch.int32)
        rows = torch.randn(ctx + n_q, width, generator=gen)
        past = [own[p // block_size] * block_size + p % block_size for p in range(ctx)]
        store_latent_ref(cache, rows[:ctx], torch.tensor(past, dtype=torch.int64))
        slots += [own[p // block_size] * block_size + p % block_size
                  for p in range(ctx, ctx + n_q)]
        new = rows[ctx:]
        if cache_dtype.itemsize == 1:
            # on the 8-bit grid already: the interpreter's float8 conversion rounds a value
            # just below a power of two down to the power below it, the GPU's to nearest
            new = new.to(cache_dtype).float()
        new_rows.append(new)
        starts.append(starts[-1] + n_q)
    n = starts[-1]
    slots += [-1] * padding
    new_rows.append(torch.randn(padding, width, generator=gen))
    t = n + padding
    meta_lens = total + [1] * padding
    tables = torch.cat([tables, torch.zeros(padding, tables.shape[1], dtype=torch.int32)])
    qsl = starts + [n + j + 1 for j in range(padding)]
    meta = AttentionMetadata(
        num_seqs=len(meta_lens), num_tokens=t,
        query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=DEVICE),
        seq_lens=torch.tensor(meta_lens, dtype=torch.int32, device=DEVICE),
        block_tables=tables.to(DEVICE),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=DEVICE),
        max_query_len=max(query_lens), max_seq_len=max(meta_lens), block_size=block_size,
        query_start_loc_cpu=qsl, seq_lens_cpu=meta_lens)
    layer = MLALayer(0, heads, rank, nope, rope, v_dim, scale=(nope + rope) ** -0.5)
    tensors = dict(
        q_nope=torch.randn(t, heads, nope, generator=gen).to(dtype),
        q_pe=torch.randn(t, heads, rope, generator=gen).to(dtype),
        latent=torch.cat(new_rows).to(dtype),
        w_uk=(torch.randn(heads, nope, rank, generator=gen) * rank ** -0.5).to(dtype),
        w_uv=(torch.randn(heads, v_dim, rank, generator=gen) * rank ** -0.5).to(dtype))
    tensors = {k: v.to(DEVICE) for k, v in tensors.items()}
    return layer, meta, cache.to(DEVICE), tensors, n


def _check(seed, num_splits=None, **shape):
    layer, meta, cache, x, n = _case(seed, **shape)
    ref_cache = cache.clone()
    store_latent_ref(ref_cache, x["latent"], meta.slot_mapping)
    real = len(shape["query_lens"])  # the padding rows' outputs are not compared
    ref = mla_attention_ref(x["q_nope"], x["q_pe"], ref_cache, w_uk=x["w_uk"], w_uv=x["w_uv"],
                            query_start_loc=meta.query_start_loc_cpu[:real + 1],
                            seq_lens=meta.seq_lens_cpu[:real], block_tables=meta.block_tables,
                            scale=layer.scale)
    backend = TritonAttentionBackend()
    backend.num_splits = num_splits
    out = backend.forward_mla(layer, x["q_nope"], x["q_pe"], x["latent"], cache, x["w_uk"],
                              x["w_uv"], meta)
    # the store wrote exactly the reference's bytes, padding rows nowhere
    assert torch.equal(cache.view(torch.uint8) if cache.element_size() == 1 else cache,
                       ref_cache.view(torch.uint8) if cache.element_size() == 1 else ref_cache)
    tol = 2e-2 if shape["dtype"] != torch.float32 else 1e-4
    torch.testing.assert_close(out[:n].float(), ref[:n].float(), rtol=tol, atol=tol,
                               msg=lambda m: f"seed {seed}: {m}")


@pytest.mark.parametrize(("dtype", "cache_dtype", "num_splits"), [
    (torch.float32, torch.float32, 1), (torch.bfloat16, torch.bfloat16, 3),
    (torch.float16, torch.float16, None), (torch.bfloat16, torch.float8_e4m3fn, 2),
], ids=str)
def test_decode_absorbed_over_tiles_blocks_and_splits(dtype, cache_dtype, num_splits):
    """Decode steps: contexts of 1 token up past several key tiles, 20 heads (two head
    blocks, the second partly masked), a rank and rope width that need padding, and padding
    rows (slot -1) as a CUDA graph's batch has them."""
    ctx = [0, 3, 16, 70, 129]
    _check(seed_of("decode", dtype, cache_dtype, num_splits), num_splits,
           heads=20, rank=48, rope=8, nope=16, v_dim=12, query_lens=[1] * len(ctx),
           context_lens=ctx, block_size=16, dtype=dtype, cache_dtype=cache_dtype, padding=2)


@pytest.mark.parametrize(("query_lens", "context_lens", "rope", "dtype", "cache_dtype"), [
    ([5, 9, 1], [12, 0, 20], 16, torch.float32, torch.float32),
    ([1, 1, 7, 1], [30, 2, 9, 0], 16, torch.float32, torch.float32),
    # q/k heads of 16 + 8 and an 8-bit cache: padded to 32 wide, the blocks gathered as bytes
    ([6, 1, 11], [17, 4, 0], 8, torch.bfloat16, torch.float8_e4m3fn),
], ids=str)
def test_prefill_chunks_beside_decodes_store_and_attend(query_lens, context_lens, rope, dtype,
                                                        cache_dtype):
    """A mixed step (prefix-cached chunks, a whole prompt, decodes) stores every row with the
    kernel; the decode rows go through the absorbed kernels at their own rows, the prompts
    through the prefill kernel over K/V expanded from their blocks."""
    _check(seed_of("mixed", tuple(query_lens)), None, heads=4, rank=32, rope=rope, nope=16,
           v_dim=16, query_lens=query_lens, context_lens=context_lens, block_size=8,
           dtype=dtype, cache_dtype=cache_dtype)


if DEVICE == "cuda":  # DeepSeek's own widths: too slow for the interpreter
    @pytest.mark.parametrize("heads", [16, 128])
    def test_decode_at_deepseek_widths(heads):
        """kv_lora_rank 512, rope 64, nope 128, v 128 (V2-Lite: 16 heads; V3: 128), bf16."""
        _check(seed_of("wide", heads), None, heads=heads, rank=512, rope=64, nope=128,
               v_dim=128, query_lens=[1] * 4, context_lens=[1, 100, 1000, 4000],
               block_size=16, dtype=torch.bfloat16, cache_dtype=torch.bfloat16)
