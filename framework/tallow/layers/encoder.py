"""The base class of encoder-only model plugins (BERT and its kin): models that embed.

An encoder reads its whole input at once: its attention layers are bidirectional
(``Attention(..., causal=False)``), so the engine computes each sequence whole in one step and
keeps nothing of it afterwards. It has no LM head; the engine pools its hidden states
(:mod:`tallow.layers.pooling`). Loading, naming maps and the completeness check are those of
:class:`~tallow.layers.CausalLM`.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from .causal_lm import CausalLM


class EncoderModel(CausalLM):
    """An encoder over one flat batch: ``forward(input_ids [T], positions [T]) -> hidden
    [T, H]`` with every sequence of the batch whole (positions from 0)."""

    tasks: ClassVar[tuple[str, ...]] = ("embed",)
    #: sentence-transformers' default for a plain encoder checkpoint
    default_pooling: ClassVar[str] = "mean"

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError(
            f"{type(self).__name__} is an encoder without an LM head: it "
            "serves embeddings (model.task embed), not generation"
        )
