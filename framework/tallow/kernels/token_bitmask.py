"""Structured outputs' token masks: set to -inf the logits of tokens a grammar does not allow.

A mask row is packed, 32 tokens to an int32 word (the layout of
:mod:`tallow.plugin.grammar`): token ``t`` is allowed iff bit ``t % 32`` of word ``t // 32`` is
set. Only the constrained rows of a step carry a mask; ``rows`` says which rows of the logits
they belong to.

:func:`masked_argmax` is greedy decoding under the masks in one pass over the logits (the
argmax kernel reads each row's mask words beside its logits), where
:func:`apply_token_bitmask` and an argmax would write the masked logits and read them again.
"""

from __future__ import annotations

import torch

from ._dispatch import triton_enabled


def _check(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None) -> None:
    if logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(
            f"logits: expected a 2-D floating-point tensor, got {logits.dtype} "
            f"{tuple(logits.shape)}"
        )
    if bitmask.dim() != 2 or bitmask.dtype != torch.int32:
        raise ValueError(
            f"bitmask: expected a 2-D int32 tensor, got {bitmask.dtype} {tuple(bitmask.shape)}"
        )
    words = (logits.shape[1] + 31) // 32
    if bitmask.shape[1] != words:
        raise ValueError(
            f"bitmask: expected {words} words per row for {logits.shape[1]} "
            f"tokens, got {bitmask.shape[1]}"
        )
    expected = logits.shape[0] if rows is None else rows.shape[0]
    if bitmask.shape[0] != expected:
        raise ValueError(f"bitmask: expected {expected} rows, got {bitmask.shape[0]}")


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The allowed tokens of each mask row as a bool tensor [rows, vocab_size]."""
    bits = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    allowed = ((bitmask.unsqueeze(-1) >> bits) & 1).bool()
    return allowed.reshape(bitmask.shape[0], -1)[:, :vocab_size]


def apply_token_bitmask_ref(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None
) -> None:
    """Plain-torch reference of :func:`apply_token_bitmask`."""
    _check(logits, bitmask, rows)
    if bitmask.shape[0] == 0:
        return
    disallowed = ~unpack_bitmask(bitmask, logits.shape[1])
    if rows is None:
        logits.masked_fill_(disallowed, float("-inf"))
    else:
        logits[rows] = logits[rows].masked_fill(disallowed, float("-inf"))


def apply_token_bitmask(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None
) -> None:
    """In place: logits [N, V] (any float dtype) get -inf for every token that row's mask
    does not allow. ``bitmask`` [M, ceil(V / 32)] int32 holds the masks of rows ``rows``
    [M] int64 of the logits (None: M == N, mask i for row i); other rows are left alone. The
    Triton kernel on CUDA tensors, the reference elsewhere."""
    if not triton_enabled(logits):
        apply_token_bitmask_ref(logits, bitmask, rows)
        return
    _check(logits, bitmask, rows)
    if bitmask.shape[0] == 0:
        return
    from ._token_bitmask_triton import apply_token_bitmask_triton

    if rows is None:
        rows = torch.arange(logits.shape[0], dtype=torch.int64, device=logits.device)
    apply_token_bitmask_triton(logits, bitmask, rows)


def masked_argmax_ref(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None
) -> torch.Tensor:
    """Plain-torch reference of :func:`masked_argmax` (``logits`` is left unchanged)."""
    masked = logits.clone()
    apply_token_bitmask_ref(masked, bitmask, rows)
    return masked.argmax(dim=-1)


def masked_argmax(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor | None = None
) -> torch.Tensor:
    """The argmax of each row of ``logits`` [N, V] among the tokens its mask allows, int64
    [N]: the argmax after :func:`apply_token_bitmask` (same ``bitmask`` and ``rows``; rows
    without a mask take the plain argmax; ties go to the first index, NaN counts as
    largest), without changing ``logits``. The Triton kernel on CUDA tensors, the reference
    elsewhere."""
    _check(logits, bitmask, rows)
    if not triton_enabled(logits) or logits.shape[0] == 0:
        return masked_argmax_ref(logits, bitmask, rows)
    from ._argmax_triton import argmax_rows_triton

    if logits.stride(1) != 1:
        logits = logits.contiguous()
    bitmask = bitmask.contiguous()
    if rows is None:
        return argmax_rows_triton(logits, bitmask)
    mask_of_row = torch.full((logits.shape[0],), -1, dtype=torch.int32, device=logits.device)
    mask_of_row[rows] = torch.arange(rows.shape[0], dtype=torch.int32, device=logits.device)
    return argmax_rows_triton(logits, bitmask, mask_of_row)
