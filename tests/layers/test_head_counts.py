"""Attention head counts are per tensor-parallel rank; QKVParallelLinear takes the totals."""

from __future__ import annotations

import pytest

from tallow.layers import Attention, BuildContext, QKVParallelLinear


@pytest.mark.parametrize(
    "tp,heads,kv,rank_heads,rank_kv,replicas",
    [
        (1, 8, 2, 8, 2, 1),
        (2, 8, 2, 4, 1, 1),
        (4, 8, 2, 2, 1, 2),
        (8, 8, 8, 1, 1, 1),
    ],
)
def test_qkv_projection_turns_totals_into_this_ranks_counts(
    tp, heads, kv, rank_heads, rank_kv, replicas
):
    qkv = QKVParallelLinear(64, 8, heads, kv, build=BuildContext(tp_rank=tp - 1, tp_size=tp))
    assert (qkv.total_num_heads, qkv.total_num_kv_heads) == (heads, kv)
    assert (qkv.num_heads, qkv.num_kv_heads, qkv.kv_replicas) == (rank_heads, rank_kv, replicas)
    assert qkv.weight.shape[0] == (rank_heads + 2 * rank_kv) * 8
    attn = Attention(0, qkv.num_heads, qkv.num_kv_heads, 8)
    assert (attn.layer.num_heads, attn.layer.num_kv_heads) == (rank_heads, rank_kv)


def test_kv_cache_is_sized_from_the_ranks_kv_heads():
    import torch

    from tallow.kernels import kv_cache
    from tallow.kernels.kv_cast import AutoKVCodec

    def per_block(attns: list[Attention]) -> int:
        return kv_cache.footprint(
            AutoKVCodec(), [a.layer for a in attns], block_size=16, model_dtype=torch.bfloat16
        ).bytes_per_block

    qkv = QKVParallelLinear(64, 8, 8, 4, build=BuildContext(tp_rank=0, tp_size=2))
    per_rank = per_block([Attention(0, qkv.num_heads, qkv.num_kv_heads, 8)])
    assert per_rank == 2 * 16 * 2 * 8 * 2  # K and V, 16 slots, 2 KV heads of 8, 2 bytes
    assert per_block([Attention(0, 8, 4, 8)]) == 2 * per_rank


def test_grouped_query_ratio_must_be_whole():
    with pytest.raises(ValueError, match="num_heads 6 is not a multiple of num_kv_heads 4"):
        Attention(0, 6, 4, 8)
