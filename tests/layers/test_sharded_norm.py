"""ShardedRMSNorm: one rank equals OLMo 2's RMSNorm; split across simulated tensor-parallel
ranks (the all-reduce replaced by a sum of the ranks' partial sums) every rank gets its slice of
the full result, with and without replicated slices."""

from __future__ import annotations

import pytest
import torch

from tallow.layers import BuildContext, ShardedRMSNorm

GEN = torch.Generator().manual_seed(0)


def reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """OLMo 2's RMSNorm: statistics and the weight multiply in float32, then the cast."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * xf).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_rank_is_plain_rmsnorm(dtype):
    x = torch.randn(5, 32, generator=GEN).to(dtype)
    weight = 1 + 0.2 * torch.randn(32, generator=GEN)
    norm = ShardedRMSNorm(32, 1e-5, build=BuildContext(dtype=dtype))
    norm.weight.weight_loader(norm.weight, weight)
    torch.testing.assert_close(norm(x), reference(x, weight.to(dtype), 1e-5))


@pytest.mark.parametrize("tp,replicas", [(2, 1), (4, 1), (4, 2), (4, 4)])
def test_ranks_share_the_statistics(tp, replicas):
    """``full`` features over ``tp`` ranks; with ``replicas`` > 1, consecutive ranks hold the
    same slice (KV heads replicated because there are fewer than ranks)."""
    slices = tp // replicas
    full = 8 * slices
    x = torch.randn(3, full, generator=GEN)
    weight = 1 + 0.2 * torch.randn(full, generator=GEN)
    expected = reference(x, weight, 1e-6)
    size = full // slices
    norms, parts = [], []
    for rank in range(tp):
        index = rank // replicas
        norm = ShardedRMSNorm(
            full, 1e-6, size=size, rank_index=index, build=BuildContext(tp_rank=rank, tp_size=tp)
        )
        norm.weight.weight_loader(norm.weight, weight)
        part = x[:, index * size : (index + 1) * size]
        norms.append((norm, part, index))
        parts.append(norm.partial_sum_of_squares(part))
    total = sum(parts)  # what the all-reduce hands every rank
    for norm, part, index in norms:
        torch.testing.assert_close(
            norm.normalize(part, total), expected[:, index * size : (index + 1) * size]
        )


def test_bad_weights_and_slices_are_named():
    norm = ShardedRMSNorm(16, build=BuildContext(tp_rank=1, tp_size=2))
    assert norm.size == 8 and norm.rank_index == 1
    with pytest.raises(ValueError, match=r"shape \(8,\), expected \(16,\)"):
        norm.weight.weight_loader(norm.weight, torch.ones(8))
    with pytest.raises(ValueError, match="outside the 16 features"):
        ShardedRMSNorm(16, size=8, rank_index=2, build=BuildContext(tp_rank=2, tp_size=4))
