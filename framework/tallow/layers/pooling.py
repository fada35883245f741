"""Pooling: one vector per sequence from the hidden states of its tokens (embeddings).

The engine computes each embedding request's sequence whole in one step, so a sequence's rows
of the step's flat ``hidden [T, H]`` are all of its tokens, and every sequence of an embedding
step is pooled. Modes:

- ``mean``: the average over all of its tokens (special tokens included, as
  sentence-transformers averages every token its attention mask keeps);
- ``cls``: the first token (BERT's ``[CLS]``);
- ``last``: the last token (decoder embedding models, e.g. Qwen3-Embedding, whose tokenizer
  appends an end-of-text token to every input).

With ``normalize`` the vectors are scaled to unit L2 norm. Pooling runs in float32 whatever
the model's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

POOLING_MODES = ("mean", "cls", "last")


def check_pooling_mode(mode: str, where: str = "pooling") -> str:
    if mode not in POOLING_MODES:
        raise ValueError(
            f"{where}: unknown pooling mode {mode!r} (expected one of {', '.join(POOLING_MODES)})"
        )
    return mode


@dataclass(frozen=True)
class Pooler:
    """Pools hidden states into one vector per sequence (see the module docstring)."""

    mode: str
    normalize: bool

    def __post_init__(self) -> None:
        check_pooling_mode(self.mode)

    def __call__(self, hidden: torch.Tensor, query_start_loc: torch.Tensor) -> torch.Tensor:
        """``[B, H]`` float32: one vector per sequence of the flat batch ``hidden [T, H]``,
        sequence ``i`` owning rows ``query_start_loc[i]:query_start_loc[i + 1]`` (``[B + 1]``,
        on ``hidden``'s device; every sequence non-empty)."""
        pooled = pool_hidden(hidden, query_start_loc, self.mode)
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2.0, dim=-1)
        return pooled


def pool_hidden(hidden: torch.Tensor, query_start_loc: torch.Tensor, mode: str) -> torch.Tensor:
    """The ``mode`` pooling of each sequence of ``hidden`` (no normalization), float32.

    Computed on the device from ``query_start_loc`` alone, so that pooling queues behind the
    forward pass without waiting for it."""
    check_pooling_mode(mode)
    bounds = query_start_loc.to(torch.long)
    starts, ends = bounds[:-1], bounds[1:]
    if mode == "cls":
        return hidden.index_select(0, starts).float()
    if mode == "last":
        return hidden.index_select(0, ends - 1).float()
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    owner = torch.searchsorted(ends, rows, right=True)
    sums = torch.zeros(starts.shape[0], hidden.shape[1], dtype=torch.float32, device=hidden.device)
    sums.index_add_(0, owner, hidden.float())
    return sums / (ends - starts).to(torch.float32)[:, None]
