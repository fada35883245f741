"""Cache groups found in a model, the KV budget split between them and their tensors."""

from __future__ import annotations

import torch
from torch import nn

from tallow.engine.cache_groups import (
    allocate_group,
    find_cache_groups,
    sliding_need,
    split_budget,
)
from tallow.engine.kv_manager import KVCacheManager, PagedGroupSize
from tallow import SamplingParams
from tallow.engine.sequence import Sequence
from tallow.kernels.kv_cast import AutoKVCodec
from tallow.layers import (
    Attention,
    FullAttentionSpec,
    LatentCacheSpec,
    RecurrentStateSpec,
    SlidingWindowSpec,
    StateTensorSpec,
)


class Latent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cache = None

    def cache_spec(self) -> LatentCacheSpec:
        return LatentCacheSpec(width=8)

    def bind_cache(self, cache, group: int) -> None:
        self.cache, self.group = cache, group


class State(Latent):
    def cache_spec(self) -> RecurrentStateSpec:
        return RecurrentStateSpec(
            (StateTensorSpec("conv", (2, 6)), StateTensorSpec("h", (6,), torch.float32))
        )


def model() -> nn.Module:
    # Gemma-like: local, local, global, local; then a latent layer and a state layer
    layers = [Attention(i, 2, 1, 16, sliding_window=None if i == 2 else 32) for i in range(4)]
    return nn.ModuleList([State(), *reversed(layers), Latent()])


def test_groups_by_kind_paged_first_attention_by_layer_index():
    groups = find_cache_groups(model())
    kinds = [type(g.spec) for g in groups]
    assert kinds == [FullAttentionSpec, SlidingWindowSpec, LatentCacheSpec, RecurrentStateSpec]
    assert [g.index for g in groups] == [0, 1, 2, 0]
    assert [a.layer.layer_index for a in groups[1].layers] == [0, 1, 3]
    assert groups[1].window == 32 and groups[0].window is None
    merged = find_cache_groups(model(), sliding_groups=False)
    assert [len(g.layers) for g in merged if g.paged] == [4, 1]


def test_budget_split_gives_sliding_groups_their_need_and_full_groups_the_rest():
    groups = find_cache_groups(model())
    need = sliding_need(32, block_size=16, max_num_seqs=4, max_step_tokens=64)
    assert need == 4 * (2 + 1) + 4 + 1
    sizes = split_budget(
        groups, 100, [10, 30, 5], block_size=16, max_num_seqs=4, max_step_tokens=64
    )
    spare = (100 - need) * 30
    assert sizes[1] == PagedGroupSize(need, 32)
    assert sizes[0].num_blocks == sizes[2].num_blocks == 100 + spare // 15
    fixed = split_budget(
        groups,
        100,
        [10, 30, 5],
        block_size=16,
        max_num_seqs=4,
        max_step_tokens=64,
        redistribute=False,
    )
    assert [s.num_blocks for s in fixed] == [100, need, 100]


def test_group_tensors_hold_a_null_block_and_a_dummy_slot():
    groups = find_cache_groups(model())
    sizes = [PagedGroupSize(20), PagedGroupSize(9, 32), PagedGroupSize(20)]
    codec = AutoKVCodec()
    caches = [
        allocate_group(
            g, codec, size=s, block_size=16, model_dtype=torch.bfloat16, device=torch.device("cpu")
        )
        for g, s in zip(groups, sizes)
    ]
    assert caches[0][0]["k"].shape[0] == 20
    assert caches[1][0]["k"].shape[0] == 10  # the pool and its null block
    assert caches[2][0].shape == (20, 16, 8) and groups[2].layers[0].cache is caches[2][0]
    state = allocate_group(
        groups[3],
        codec,
        size=4,
        block_size=16,
        model_dtype=torch.bfloat16,
        device=torch.device("cpu"),
    )[0]
    assert state["conv"].shape == (5, 2, 6) and state["conv"].dtype == torch.bfloat16
    assert state["h"].dtype == torch.float32 and state.group == 0
    assert all(a.cache_group == 1 for a in groups[1].layers)


def test_latent_group_is_booked_like_a_full_group():
    """A latent group keeps a table per sequence and frees nothing early."""
    manager = KVCacheManager(
        [PagedGroupSize(8), PagedGroupSize(8)], block_size=4, enable_prefix_caching=False
    )
    seq = Sequence("r", 0, list(range(10)), SamplingParams(max_tokens=4))
    assert manager.can_allocate(seq, 10)
    manager.append_slots(seq, 10)
    seq.num_computed_tokens = 10
    manager.mark_computed(seq, 10)
    assert len(seq.block_tables[1]) == 3 and manager.live_blocks(seq, 1) == 3
    manager.check_invariants()
    manager.free(seq)
    assert manager.groups[1].num_free_blocks == 8
