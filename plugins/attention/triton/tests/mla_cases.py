"""Latent attention (MLA) cases that check the Triton kernels against the core's torch
reference.

Not collected on its own (no ``test_`` prefix): ``test_mla_interpret.py`` runs it with
``TRITON_INTERPRET=1`` (CPU), and on a CUDA machine ``python -m pytest
plugins/attention/triton/tests/mla_cases.py`` runs it on the GPU (also at DeepSeek's own widths).
"""

from __future__ import annotations

import zlib

import pytest
import torch

from tallow.plugin.testing.seeds import base_seed
from tallow.plugin.testing.mla_step import check_mla_step, random_mla_step
from tallow_attention_triton import ops
from tallow_attention_triton.backend import TritonAttentionBackend

if ops.interpreting():
    DEVICE = "cpu"
elif torch.cuda.is_available():
    DEVICE = "cuda"
else:
    pytest.skip(
        "needs a CUDA GPU or TRITON_INTERPRET=1 set before triton is imported "
        "(test_mla_interpret.py runs this module that way)",
        allow_module_level=True,
    )

#: the run's seed (tallow.plugin.testing.seeds)
BASE_SEED = base_seed()


def seed_of(*parts: object) -> int:
    return (zlib.crc32(repr(parts).encode()) ^ BASE_SEED) % (2**31)


def _check(
    seed,
    num_splits=None,
    *,
    heads,
    rank,
    rope,
    nope,
    v_dim,
    query_lens,
    context_lens,
    block_size,
    dtype,
    cache_dtype,
    padding=0,
):
    """A step over a shuffled paged latent cache (earlier rows stored, this step's rows to
    store, ``padding`` rows of slot -1) through the backend, against the reference."""
    step = random_mla_step(
        query_lens=query_lens,
        context_lens=context_lens,
        num_heads=heads,
        kv_lora_rank=rank,
        rope=rope,
        nope=nope,
        v_dim=v_dim,
        block_size=block_size,
        dtype=dtype,
        cache_dtype=cache_dtype,
        device=DEVICE,
        padding_rows=padding,
        seed=seed,
    )
    backend = TritonAttentionBackend()
    backend.num_splits = num_splits
    check_mla_step(step, backend, f"seed {seed}")


@pytest.mark.parametrize(
    ("dtype", "cache_dtype", "num_splits"),
    [
        (torch.float32, torch.float32, 1),
        (torch.bfloat16, torch.bfloat16, 3),
        (torch.float16, torch.float16, None),
        (torch.bfloat16, torch.float8_e4m3fn, 2),
    ],
    ids=str,
)
def test_decode_absorbed_over_tiles_blocks_and_splits(dtype, cache_dtype, num_splits):
    """Decode steps: contexts of 1 token up past several key tiles, 20 heads (two head
    blocks, the second partly masked), a rank and rope width that need padding, and padding
    rows (slot -1) as a CUDA graph's batch has them."""
    ctx = [0, 3, 16, 70, 129]
    _check(
        seed_of("decode", dtype, cache_dtype, num_splits),
        num_splits,
        heads=20,
        rank=48,
        rope=8,
        nope=16,
        v_dim=12,
        query_lens=[1] * len(ctx),
        context_lens=ctx,
        block_size=16,
        dtype=dtype,
        cache_dtype=cache_dtype,
        padding=2,
    )


@pytest.mark.parametrize(
    ("query_lens", "context_lens", "rope", "dtype", "cache_dtype"),
    [
        ([5, 9, 1], [12, 0, 20], 16, torch.float32, torch.float32),
        ([1, 1, 7, 1], [30, 2, 9, 0], 16, torch.float32, torch.float32),
        # q/k heads of 16 + 8 and an 8-bit cache: padded to 32 wide, the blocks gathered as bytes
        ([6, 1, 11], [17, 4, 0], 8, torch.bfloat16, torch.float8_e4m3fn),
    ],
    ids=str,
)
def test_prefill_chunks_beside_decodes_store_and_attend(
    query_lens, context_lens, rope, dtype, cache_dtype
):
    """A mixed step (prefix-cached chunks, a whole prompt, decodes) stores every row with the
    kernel; the decode rows go through the absorbed kernels at their own rows, the prompts
    through the prefill kernel over K/V expanded from their blocks."""
    _check(
        seed_of("mixed", tuple(query_lens)),
        None,
        heads=4,
        rank=32,
        rope=rope,
        nope=16,
        v_dim=16,
        query_lens=query_lens,
        context_lens=context_lens,
        block_size=8,
        dtype=dtype,
        cache_dtype=cache_dtype,
    )


if DEVICE == "cuda":  # DeepSeek's own widths: too slow for the interpreter

    @pytest.mark.parametrize("heads", [16, 128])
    def test_decode_at_deepseek_widths(heads):
        """kv_lora_rank 512, rope 64, nope 128, v 128 (V2-Lite: 16 heads; V3: 128), bf16."""
        _check(
            seed_of("wide", heads),
            None,
            heads=heads,
            rank=512,
            rope=64,
            nope=128,
            v_dim=128,
            query_lens=[1] * 4,
            context_lens=[1, 100, 1000, 4000],
            block_size=16,
            dtype=torch.bfloat16,
            cache_dtype=torch.bfloat16,
        )
