"""Sampling kernels: sparse logit edits and Gumbel argmax, with their torch references and the
dispatch that picks Triton on CUDA tensors and the reference elsewhere.

Logit edits are the per-request changes that touch only a few tokens of a row: logit bias, the
min_tokens mask of stop/EOS tokens, the repetition penalty over prompt+output tokens and the
frequency/presence penalties over output tokens. They are passed as a flat list of unique
``(row, token)`` entries, so their cost is the number of entries, not rows x vocabulary.

Applied to one entry, in this order (the same float32 operations on every path)::

    v = logit + bias
    v = -inf                                 if masked
    v = v / rep if v > 0 else v * rep        if in_rep         (rep = row's repetition penalty)
    v = v - count * freq                                        (count = times in the output)
    v = v - (count > 0) * presence
"""

from __future__ import annotations

import torch

from ._dispatch import triton_enabled
from .gumbel import gumbel_argmax_ref, gumbel_noise_ref
from .logit_edits import LogitEdits


def apply_logit_edits_ref(logits: torch.Tensor, edits: LogitEdits) -> None:
    """Apply ``edits`` to ``logits`` [N, V] float32 in place (torch reference)."""
    if edits.num_entries == 0:
        return
    v = logits[edits.rows, edits.tokens]
    v = v + edits.bias
    v = torch.where(edits.masked, torch.full_like(v, float("-inf")), v)
    rep = edits.repetition_penalty[edits.rows]
    penalised = torch.where(v > 0, v / rep, v * rep)
    v = torch.where(edits.in_rep, penalised, v)
    v = v - edits.counts * edits.frequency_penalty[edits.rows]
    v = v - (edits.counts > 0).to(torch.float32) * edits.presence_penalty[edits.rows]
    logits[edits.rows, edits.tokens] = v


def apply_logit_edits(logits: torch.Tensor, edits: LogitEdits) -> None:
    """Apply ``edits`` in place: the Triton kernel on CUDA, the reference elsewhere."""
    if edits.num_entries == 0:
        return
    if triton_enabled(logits):
        from ._sampling_triton import apply_logit_edits_triton

        apply_logit_edits_triton(logits, edits)
    else:
        apply_logit_edits_ref(logits, edits)


def gumbel_argmax(
    logits: torch.Tensor,
    inv_temperature: torch.Tensor,
    greedy: torch.Tensor,
    key1: torch.Tensor,
    key2: torch.Tensor,
) -> torch.Tensor:
    """The chosen token [N] int64 of each row (see ``gumbel.gumbel_argmax_ref`` for the
    contract): the fused Triton kernel on CUDA, the reference elsewhere. Both give the same
    token for the same inputs."""
    if triton_enabled(logits):
        from ._sampling_triton import gumbel_argmax_triton

        return gumbel_argmax_triton(logits, inv_temperature, greedy, key1, key2)
    return gumbel_argmax_ref(logits, inv_temperature, greedy, key1, key2)


def gumbel_noise(key1: torch.Tensor, key2: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Gumbel noise [N, vocab_size] float32 (see ``gumbel.gumbel_noise_ref``): the Triton
    kernel on CUDA, the reference elsewhere, equal to the bit."""
    if triton_enabled(key1):
        from ._sampling_triton import gumbel_noise_triton

        return gumbel_noise_triton(key1, key2, vocab_size)
    return gumbel_noise_ref(key1, key2, vocab_size)
