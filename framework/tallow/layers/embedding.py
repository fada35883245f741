"""Token embeddings and the LM head, split over the vocabulary across tensor-parallel ranks.

Rank ``r`` holds vocabulary rows ``[r*n, (r+1)*n)`` with ``n = ceil(vocab / tp)``; the last
rank's tail past the real vocabulary is zero padding, and the LM head trims it off the logits.
"""

from __future__ import annotations

from typing import Hashable

import torch
from torch import nn

from .linear import WeightSlice
from .linear_method import LinearMethod, linear_method_for, set_weight_attrs
from .model import BuildContext
from .parallel import all_gather_last_dim, all_reduce


class _VocabSharded(nn.Module):
    """What embedding and head share: the vocabulary shard of this rank, the storage chosen by
    the quantization scheme (a :class:`~tallow.layers.LinearMethod` whose output rows are
    vocabulary entries), and the loader that fills it."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        build: BuildContext | None,
        prefix: str,
        role: str,
    ) -> None:
        super().__init__()
        build = build if build is not None else BuildContext()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.tp_rank, self.tp_size = build.tp_rank, build.tp_size
        self.prefix = prefix
        self.rows_per_rank = -(-num_embeddings // self.tp_size)
        self.vocab_start = self.tp_rank * self.rows_per_rank
        self.vocab_end = min(self.vocab_start + self.rows_per_rank, num_embeddings)
        self.params_dtype = build.dtype
        self._build = build
        self._role = role
        self.quant_method: LinearMethod | None = None

    def _create_weight(self) -> None:
        b = self._build
        self.quant_method = linear_method_for(b.quant, self.prefix, self._role)
        self.quant_method.create_weights(
            self, self.embedding_dim, [self.rows_per_rank], b.dtype, b.device
        )
        for param in self.parameters(recurse=False):
            if not hasattr(param, "weight_loader"):
                set_weight_attrs(param, weight_loader=self.weight_loader)

    def checkpoint_shape(self, shard_id: Hashable | None = None) -> tuple[int, int]:
        """``(vocab_size, hidden_size)``: the checkpoint tensor is the whole vocabulary."""
        return self.num_embeddings, self.embedding_dim

    def weight_slices(self, shard_id: Hashable | None = None) -> list[WeightSlice]:
        """This rank's vocabulary rows, zero-padded to ``rows_per_rank``."""
        if shard_id is not None:
            raise ValueError(
                f"{self.prefix or type(self).__name__}: has no shards, got shard {shard_id!r}"
            )
        n = self.vocab_end - self.vocab_start
        return [WeightSlice(0, (self.vocab_start, self.vocab_end), pad_rows=self.rows_per_rank - n)]

    def weight_loader(
        self, param: torch.Tensor, loaded: torch.Tensor, shard_id: object = None
    ) -> None:
        """Copy this rank's rows of the ``[vocab, dim]`` checkpoint tensor into ``param``."""
        what = self.prefix or type(self).__name__
        if shard_id is not None:
            raise ValueError(f"{what}: has no shards, got shard {shard_id!r}")
        expected = (self.num_embeddings, self.embedding_dim)
        if tuple(loaded.shape) != expected:
            raise ValueError(
                f"{what}: checkpoint tensor has shape {tuple(loaded.shape)}, "
                f"expected {expected} (vocab_size, hidden_size)"
            )
        n = self.vocab_end - self.vocab_start
        with torch.no_grad():
            param.data[:n].copy_(loaded[self.vocab_start : self.vocab_end])
            param.data[n:].zero_()


class VocabEmbedding(_VocabSharded):
    """``forward(input_ids [T]) -> [T, dim]``.

    The rows are stored as the quantization scheme's ``embedding_method(prefix)`` says (dense
    without one); only the rows of the step's tokens are read (and decoded)."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        build: BuildContext | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__(num_embeddings, embedding_dim, build, prefix, "embedding")
        self._create_weight()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        method = self.quant_method
        assert method is not None, "an embedding creates its weight when it is built"
        if self.tp_size == 1:
            return method.embedding(self, input_ids)
        mine = (input_ids >= self.vocab_start) & (input_ids < self.vocab_end)
        local = torch.where(mine, input_ids - self.vocab_start, torch.zeros_like(input_ids))
        out = method.embedding(self, local)
        out = out * mine.unsqueeze(-1).to(out.dtype)
        return all_reduce(out, self.tp_size)

    def extra_repr(self) -> str:
        return (
            f"vocab={self.num_embeddings}, dim={self.embedding_dim}, "
            f"rows={self.vocab_start}:{self.vocab_end}, "
            f"method={type(self.quant_method).__name__}"
        )


class LMHead(_VocabSharded):
    """``forward(hidden [N, dim]) -> logits [N, vocab]`` in the hidden states' dtype.

    Its weight is stored as the quantization scheme's ``head_method(prefix)`` says (dense
    without one). ``tie_with`` shares the weight of a :class:`VocabEmbedding`
    (``tie_word_embeddings``): the head then owns no parameter of its own and multiplies by the
    embedding's storage through the embedding's method.
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        bias: bool = False,
        tie_with: VocabEmbedding | None = None,
        build: BuildContext | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__(num_embeddings, embedding_dim, build, prefix, "head")
        self._tied_to: list[VocabEmbedding] = []  # a list: not registered as a submodule
        if tie_with is not None:
            if (tie_with.num_embeddings, tie_with.embedding_dim) != (num_embeddings, embedding_dim):
                raise ValueError(
                    f"{prefix or 'LMHead'}: cannot tie a [{num_embeddings}, {embedding_dim}] head "
                    f"to a [{tie_with.num_embeddings}, {tie_with.embedding_dim}] embedding"
                )
            self.tie(tie_with)
        else:
            self._create_weight()
        if bias:
            b = nn.Parameter(
                torch.zeros(self.rows_per_rank, dtype=self._build.dtype, device=self._build.device),
                requires_grad=False,
            )
            set_weight_attrs(b, weight_loader=self._bias_loader)
            self.bias = b
        else:
            self.register_parameter("bias", None)

    @property
    def tied(self) -> bool:
        return bool(self._tied_to)

    def tie(self, embedding: VocabEmbedding) -> None:
        """Share ``embedding``'s weight from now on (a checkpoint without a separate head)."""
        self.weight = embedding.weight
        self.quant_method = None  # the embedding's method serves (and finishes) the storage
        self._tied_to[:] = [embedding]

    def _bias_loader(
        self, param: torch.Tensor, loaded: torch.Tensor, shard_id: object = None
    ) -> None:
        what = f"{self.prefix or 'LMHead'} bias"
        if tuple(loaded.shape) != (self.num_embeddings,):
            raise ValueError(
                f"{what}: checkpoint tensor has shape {tuple(loaded.shape)}, "
                f"expected ({self.num_embeddings},)"
            )
        n = self.vocab_end - self.vocab_start
        with torch.no_grad():
            param.data[:n].copy_(loaded[self.vocab_start : self.vocab_end])
            param.data[n:].zero_()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        owner = self._tied_to[0] if self._tied_to else self
        method = owner.quant_method
        assert method is not None, "a head's storage is its own or its tied embedding's"
        logits = method.apply(owner, hidden, self.bias)
        logits = all_gather_last_dim(logits, self.tp_size)
        return logits[..., : self.num_embeddings]

    def extra_repr(self) -> str:
        return f"vocab={self.num_embeddings}, dim={self.embedding_dim}, tied={self.tied}"
