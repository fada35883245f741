"""Triton version of :func:`tallow.kernels.token_bitmask.apply_token_bitmask_ref`: one program
per (masked row, block of tokens) unpacks its words and writes -inf where a bit is clear, and
writes nothing elsewhere (most of a row is allowed in free text, little inside JSON syntax)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .jit import step_jit

_BLOCK = 1024


@step_jit(pointers=["bitmask_ptr", "rows_ptr"])
def _apply_token_bitmask_kernel(
    logits_ptr, stride_row, bitmask_ptr, words, rows_ptr, vocab, BLOCK: tl.constexpr
):
    m = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < vocab
    row = tl.load(rows_ptr + m)
    word = tl.load(bitmask_ptr + m.to(tl.int64) * words + offs // 32, mask=valid, other=0)
    allowed = ((word >> (offs % 32)) & 1) != 0
    blocked = tl.full([BLOCK], float("-inf"), tl.float32).to(logits_ptr.dtype.element_ty)
    tl.store(logits_ptr + row * stride_row + offs, blocked, mask=valid & ~allowed)


def apply_token_bitmask_triton(
    logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor
) -> None:
    """Mask rows ``rows`` of ``logits`` (last dim contiguous) by ``bitmask``, in place."""
    if logits.stride(1) != 1:
        raise ValueError("logits: the token dimension must be contiguous")
    vocab = logits.shape[1]
    masks = bitmask.shape[0]
    _apply_token_bitmask_kernel[(masks, triton.cdiv(vocab, _BLOCK))](
        logits,
        logits.stride(0),
        bitmask.contiguous(),
        bitmask.shape[1],
        rows.to(torch.int64).contiguous(),
        vocab,
        BLOCK=_BLOCK,
    )
