"""Token embeddings and the LM head, split over the vocabulary across tensor-parallel ranks.

Rank ``r`` holds vocabulary rows ``[r*n, (r+1)*n)`` with ``n = ceil(vocab / tp)``; the last
rank's tail past the real vocabulary is zero padding, and the LM head trims it off the logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tallow.kernels.linear import linear as dense_linear

from .model import BuildContext
from .parallel import all_gather_last_dim, all_reduce


class _VocabSharded(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, build: BuildContext | None,
                 prefix: str) -> None:
        super().__init__()
        build = build if build is not None else BuildContext()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.tp_rank, self.tp_size = build.tp_rank, build.tp_size
        self.prefix = prefix
        self.rows_per_rank = -(-num_embeddings // self.tp_size)
        self.vocab_start = self.tp_rank * self.rows_per_rank
        self.vocab_end = min(self.vocab_start + self.rows_per_rank, num_embeddings)
        self._build = build

    def _new_weight(self) -> nn.Parameter:
        b = self._build
        w = nn.Parameter(torch.zeros(self.rows_per_rank, self.embedding_dim, dtype=b.dtype,
                                     device=b.device), requires_grad=False)
        w.weight_loader = self.weight_loader
        w.output_dim = 0
        return w

    def weight_loader(self, param: torch.Tensor, loaded: torch.Tensor,
                      shard_id: object = None) -> None:
        """Copy this rank's rows of the ``[vocab, dim]`` checkpoint tensor into ``param``."""
        what = self.prefix or type(self).__name__
        if shard_id is not None:
            raise ValueError(f"{what}: has no shards, got shard {shard_id!r}")
        expected = (self.num_embeddings, self.embedding_dim)
        if tuple(loaded.shape) != expected:
            raise ValueError(f"{what}: checkpoint tensor has shape {tuple(loaded.shape)}, "
                             f"expected {expected} (vocab_size, hidden_size)")
        n = self.vocab_end - self.vocab_start
        with torch.no_grad():
            param.data[:n].copy_(loaded[self.vocab_start:self.vocab_end])
            param.data[n:].zero_()


class VocabEmbedding(_VocabSharded):
    """``forward(input_ids [T]) -> [T, dim]``."""

    def __init__(self, num_embeddings: int, embedding_dim: int, *,
                 build: BuildContext | None = None, prefix: str = "") -> None:
        super().__init__(num_embeddings, embedding_dim, build, prefix)
        self.weight = self._new_weight()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        mine = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local = torch.where(mine, input_ids - self.vocab_start, torch.zeros_like(input_ids))
        out = F.embedding(local, self.weight) * mine.unsqueeze(-1).to(self.weight.dtype)
        return all_reduce(out, self.tp_size)

    def extra_repr(self) -> str:
        return (f"vocab={self.num_embeddings}, dim={self.embedding_dim}, "
                f"rows={self.vocab_start}:{self.vocab_end}")


class LMHead(_VocabSharded):
    """``forward(hidden [N, dim]) -> logits [N, vocab]`` in the hidden states' dtype.

    ``tie_with`` shares the weight of a :class:`VocabEmbedding` (``tie_word_embeddings``): the
    head then owns no parameter of its own.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, *, bias: bool = False,
                 tie_with: VocabEmbedding | None = None, build: BuildContext | None = None,
                 prefix: str = "") -> None:
        super().__init__(num_embeddings, embedding_dim, build, prefix)
        if tie_with is not None:
            if (tie_with.num_embeddings, tie_with.embedding_dim) != (num_embeddings,
                                                                     embedding_dim):
                raise ValueError(
                    f"{prefix or 'LMHead'}: cannot tie a [{num_embeddings}, {embedding_dim}] head "
                    f"to a [{tie_with.num_embeddings}, {tie_with.embedding_dim}] embedding"
                )
            self.weight = tie_with.weight
        else:
            self.weight = self._new_weight()
        self.tied = tie_with is not None
        if bias:
            b = nn.Parameter(torch.zeros(self.rows_per_rank, dtype=self._build.dtype,
                                         device=self._build.device), requires_grad=False)
            b.weight_loader = self._bias_loader
            self.bias = b
        else:
            self.register_parameter("bias", None)

    def tie(self, embedding: VocabEmbedding) -> None:
        """Share ``embedding``'s weight from now on (a checkpoint without a separate head)."""
        self.weight = embedding.weight
        self.tied = True

    def _bias_loader(self, param: torch.Tensor, loaded: torch.Tensor,
                     shard_id: object = None) -> None:
        what = f"{self.prefix or 'LMHead'} bias"
        if tuple(loaded.shape) != (self.num_embeddings,):
            raise ValueError(f"{what}: checkpoint tensor has shape {tuple(loaded.shape)}, "
                             f"expected ({self.num_embeddings},)")
        n = self.vocab_end - self.vocab_start
        with torch.no_grad():
            param.data[:n].copy_(loaded[self.vocab_start:self.vocab_end])
            param.data[n:].zero_()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = dense_linear(hidden, self.weight, self.bias)
        logits = all_gather_last_dim(logits, self.tp_size)
        return logits[..., :self.num_embeddings]

    def extra_repr(self) -> str:
        return f"vocab={self.num_embeddings}, dim={self.embedding_dim}, tied={self.tied}"
