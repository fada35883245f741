"""Triton argmax over the rows of a logits matrix, in two stages.

One program per row would leave most of the GPU idle for a 128k-entry vocabulary at batch 1
(a single reduction per row is latency-bound there); here each row is cut into chunks reduced in
parallel, then a second launch picks the best chunk of each row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import allow_next, pdl_enabled, wait_prior

CHUNK = 4096


@triton.jit
def _chunk_argmax_kernel(
    x_ptr,
    stride_row,
    n,
    best_val_ptr,
    best_idx_ptr,
    n_chunks,
    bitmask_ptr,
    words,
    mask_of_row_ptr,
    CHUNK: tl.constexpr,
    MASKED: tl.constexpr,
    MASK_INDEXED: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    wait_prior(USE_PDL)  # everything below reads or writes this step's tensors
    allow_next(USE_PDL)
    chunk = tl.program_id(1)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    valid = offs < n
    x = tl.load(x_ptr + row * stride_row + offs, mask=valid, other=float("-inf"))
    x = x.to(tl.float32)
    if MASKED:
        # A grammar's packed mask (see token_bitmask): tokens whose bit is clear count as
        # -inf; a row without a mask (index -1) reads all bits set.
        if MASK_INDEXED:
            m = tl.load(mask_of_row_ptr + row).to(tl.int64)
        else:
            m = row
        word = tl.load(bitmask_ptr + m * words + offs // 32, mask=valid & (m >= 0), other=-1)
        x = tl.where(((word >> (offs % 32)) & 1) != 0, x, float("-inf"))
    # NaN counts as the largest value, as in torch.argmax.
    x = tl.where(x != x, float("inf"), x)
    i = tl.argmax(x, axis=0, tie_break_left=True)
    v = tl.max(x, axis=0)
    tl.store(best_val_ptr + row * n_chunks + chunk, v)
    tl.store(best_idx_ptr + row * n_chunks + chunk, chunk * CHUNK + i)


@triton.jit
def _pick_chunk_kernel(
    best_val_ptr, best_idx_ptr, out_ptr, n_chunks, C_PAD: tl.constexpr, USE_PDL: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    wait_prior(USE_PDL)  # everything below reads or writes this step's tensors
    allow_next(USE_PDL)
    offs = tl.arange(0, C_PAD)
    mask = offs < n_chunks
    v = tl.load(best_val_ptr + row * n_chunks + offs, mask=mask, other=float("-inf"))
    c = tl.argmax(v, axis=0, tie_break_left=True)  # chunks are in index order: ties go left
    idx = tl.load(best_idx_ptr + row * n_chunks + c)
    tl.store(out_ptr + row, idx.to(tl.int64))


def argmax_rows_triton(
    x: torch.Tensor, bitmask: torch.Tensor | None = None, mask_of_row: torch.Tensor | None = None
) -> torch.Tensor:
    """Triton version of ``argmax.argmax_rows_ref`` (x [rows, n], last dim contiguous).
    With ``bitmask`` [M, ceil(n / 32)] int32, a token whose bit is clear in its row's mask
    counts as -inf: row ``r``'s mask is ``bitmask[r]``, or ``bitmask[mask_of_row[r]]``
    with ``mask_of_row`` [rows] int32 (-1: the row has none)."""
    rows, n = x.shape
    n_chunks = triton.cdiv(n, CHUNK)
    best_val = torch.empty((rows, n_chunks), dtype=torch.float32, device=x.device)
    best_idx = torch.empty((rows, n_chunks), dtype=torch.int32, device=x.device)
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    use_pdl = pdl_enabled(x)
    masked = bitmask is not None
    indexed = mask_of_row is not None
    _chunk_argmax_kernel[(rows, n_chunks)](
        x,
        x.stride(0),
        n,
        best_val,
        best_idx,
        n_chunks,
        bitmask if masked else x,
        bitmask.shape[1] if masked else 0,  # type: ignore[union-attr]
        mask_of_row if indexed else x,
        CHUNK=CHUNK,
        MASKED=masked,
        MASK_INDEXED=indexed,
        USE_PDL=use_pdl,
        num_warps=8,
        launch_pdl=use_pdl,
    )
    _pick_chunk_kernel[(rows,)](
        best_val,
        best_idx,
        out,
        n_chunks,
        C_PAD=max(16, triton.next_power_of_2(n_chunks)),
        USE_PDL=use_pdl,
        num_warps=1,
        launch_pdl=use_pdl,
    )
    return out
