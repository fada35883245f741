"""RMSNorm over features that tensor parallelism splits across ranks.

OLMo 2 normalises its whole query projection (every head at once) and its whole key
projection, not each head: with the heads split across ranks, the mean square must be summed
over all of them.
"""

from __future__ import annotations

import torch
from torch import nn

from .linear_method import set_weight_attrs
from .model import BuildContext
from .parallel import all_reduce


class ShardedRMSNorm(nn.Module):
    """``forward(x [T, size]) -> [T, size]``: RMSNorm of the full ``[T, size * tp_size]``
    vector of which this rank holds ``size`` features.

    This rank's slice of the checkpoint weight (``full_size`` features) starts at
    ``rank_index * size``; ranks that hold the same slice (replicated KV heads) pass the same
    ``rank_index``. The sum of squares is all-reduced and divided by ``size * tp_size``, which
    counts a replicated slice as often in the sum as in the count, so the mean is exact either
    way. The weight multiplies in float32, before the cast back to ``x``'s dtype (the OLMo 2
    order).
    """

    def __init__(
        self,
        full_size: int,
        eps: float = 1e-6,
        *,
        size: int | None = None,
        rank_index: int | None = None,
        build: BuildContext | None = None,
    ) -> None:
        super().__init__()
        build = build if build is not None else BuildContext()
        self.full_size = int(full_size)
        self.size = int(size if size is not None else full_size // build.tp_size)
        self.rank_index = int(rank_index if rank_index is not None else build.tp_rank)
        self.tp_size = build.tp_size
        self.eps = float(eps)
        if (self.rank_index + 1) * self.size > self.full_size:
            raise ValueError(
                f"ShardedRMSNorm: slice {self.rank_index} of {self.size} features "
                f"lies outside the {self.full_size} features of the weight"
            )
        self.weight = nn.Parameter(
            torch.ones(self.size, dtype=build.dtype, device=build.device), requires_grad=False
        )
        set_weight_attrs(self.weight, weight_loader=self._load_weight)

    def _load_weight(
        self, param: torch.Tensor, loaded: torch.Tensor, shard_id: object = None
    ) -> None:
        if shard_id is not None:
            raise ValueError(f"ShardedRMSNorm weight has no shards, got {shard_id!r}")
        if tuple(loaded.shape) != (self.full_size,):
            raise ValueError(
                f"checkpoint tensor has shape {tuple(loaded.shape)}, expected ({self.full_size},)"
            )
        with torch.no_grad():
            param.copy_(loaded.narrow(0, self.rank_index * self.size, self.size))

    def partial_sum_of_squares(self, x: torch.Tensor) -> torch.Tensor:
        """``[T, 1]`` float32: this rank's share of the sum of squares."""
        return x.float().pow(2).sum(-1, keepdim=True)

    def normalize(self, x: torch.Tensor, sum_of_squares: torch.Tensor) -> torch.Tensor:
        """Scale ``x`` by the root mean square that ``sum_of_squares`` (over every rank) gives."""
        mean = sum_of_squares / (self.size * self.tp_size)
        out = x.float() * torch.rsqrt(mean + self.eps)
        return (out * self.weight.float()).to(x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.normalize(x, all_reduce(self.partial_sum_of_squares(x), self.tp_size))

    def extra_repr(self) -> str:
        return (
            f"{self.size} of {self.full_size}, slice={self.rank_index}, eps={self.eps}, "
            f"tp={self.tp_size}"
        )
