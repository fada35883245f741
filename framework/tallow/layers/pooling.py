"""Pooling: one vector per sequence from the hidden states of its tokens (embeddings).

The engine computes each embedding request's sequence whole in one step, so a sequence's rows
of the step's flat ``hidden [T, H]`` are all of its tokens; ``spans`` says where each pooled
sequence's rows are. Modes:

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
from typing import Sequence

import torch

POOLING_MODES = ("mean", "cls", "last")


def check_pooling_mode(mode: str, where: str = "pooling") -> str:
    if mode not in POOLING_MODES:
        raise ValueError(f"{where}: unknown pooling mode {mode!r} (expected one of "
                         f"{', '.join(POOLING_MODES)})")
    return mode


@dataclass(frozen=True)
class Pooler:
    """Pools hidden states into one vector per sequence (see the module docstring)."""

    mode: str
    normalize: bool

    def __post_init__(self) -> None:
        check_pooling_mode(self.mode)

    def __call__(self, hidden: torch.Tensor, spans: Sequence[tuple[int, int]]) -> torch.Tensor:
        """``[len(spans), H]`` float32: one vector per ``(start, end)`` row range of
        ``hidden [T, H]`` (each range non-empty)."""
        pooled = pool_hidden(hidden, spans, self.mode)
        if self.normalize:
            pooled = torch.nn.functional.normalize(pooled, p=2.0, dim=-1)
        return pooled


def pool_hidden(hidden: torch.Tensor, spans: Sequence[tuple[int, int]],
                mode: str) -> torch.Tensor:
    """The ``mode`` pooling of each row range of ``hidden`` (no normalization), float32."""
    if any(end <= start for start, end in spans):
        raise ValueError("pooling needs at least one row per sequence")
    device = hidden.device
    if mode == "cls":
        rows = torch.tensor([start for start, _ in spans], dtype=torch.long)
        return hidden.index_select(0, rows.to(device, non_blocking=True)).float()
    if mode == "last":
        rows = torch.tensor([end - 1 for _, end in spans], dtype=torch.long)
        return hidden.index_select(0, rows.to(device, non_blocking=True)).float()
    check_pooling_mode(mode)
    lengths = torch.tensor([end - start for start, end in spans], dtype=torch.long)
    segment = torch.repeat_interleave(torch.arange(len(spans)), lengths)
    covered = spans[0][0] == 0 and all(a[1] == b[0] for a, b in zip(spans, spans[1:])) \
        and spans[-1][1] == hidden.shape[0]
    rows = hidden if covered else hidden.index_select(0, torch.cat(
        [torch.arange(start, end) for start, end in spans]).to(device, non_blocking=True))
    sums = torch.zeros(len(spans), hidden.shape[1], dtype=torch.float32, device=device)
    sums.index_add_(0, segment.to(device, non_blocking=True), rows.float())
    return sums / lengths.to(device=device, dtype=torch.float32, non_blocking=True)[:, None]
