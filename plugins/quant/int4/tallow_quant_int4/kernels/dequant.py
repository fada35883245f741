"""Decoding a whole weight (or some of its rows) into a float tensor: the workspace that
large batches multiply with cuBLAS, and the rows an embedding gathers.

A program decodes ``BR`` rows by ``BQ`` quads. Each thread holds whole quads and writes each
quad's values in column order as 16-byte vectors (8 bf16 values: the two 4-bit slots of one
byte, put side by side by a join, or two 8-bit slots), so the kernel reads 0.5 (1) byte and
writes 2 bytes per weight at close to copy speed. The values are ``scale * (q - zero)`` in
float32 rounded once to the output dtype, the reference's bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..layout import QUAD_COLUMNS, IntWeight

BLOCK_ROWS = 8
BLOCK_QUADS = 16


@triton.jit
def _slot(codes, S: tl.constexpr, BITS: tl.constexpr):
    return ((codes >> (BITS * S)) & ((1 << BITS) - 1)).to(tl.float32)


@triton.jit
def _dequant_kernel(
    q_ptr,
    s_ptr,
    z_ptr,
    ids_ptr,
    out_ptr,
    N,
    n_quads,
    stride_q,
    stride_s,
    stride_out,
    BR: tl.constexpr,
    BQ: tl.constexpr,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    ZEROS: tl.constexpr,
    GATHER: tl.constexpr,
):
    pid_r = tl.program_id(0)
    pid_q = tl.program_id(1)
    QC: tl.constexpr = 32 if BITS == 4 else 16
    out_rows = pid_r * BR + tl.arange(0, BR)
    row_ok = out_rows < N
    if GATHER:  # rows ``ids`` of the weight, in order
        rows = tl.load(ids_ptr + out_rows, mask=row_ok, other=0)
    else:
        rows = out_rows
    quads = pid_q * BQ + tl.arange(0, BQ)
    mask2 = row_ok[:, None] & (quads < n_quads)[None, :]
    r2 = rows.to(tl.int64)[:, None]
    u = tl.arange(0, 4)[None, None, :]
    codes = tl.load(
        q_ptr + r2[:, :, None] * stride_q + quads[None, :, None] * 4 + u,
        mask=mask2[:, :, None],
        other=0,
    )
    grp = (quads * QC) // GROUP
    scale = tl.load(s_ptr + r2 * stride_s + grp[None, :], mask=mask2, other=0.0)
    scale = scale.to(tl.float32)[:, :, None]
    if ZEROS:
        zero = tl.load(z_ptr + r2 * stride_s + grp[None, :], mask=mask2, other=0)
        zero = zero.to(tl.float32)[:, :, None]
    else:
        zero = 1 << (BITS - 1)
    OUT_TY: tl.constexpr = out_ptr.dtype.element_ty
    if BITS == 4:
        # slots 2p and 2p + 1 are columns 8p + u and 8p + 4 + u: joined, 8 consecutive values
        v0 = tl.join(
            (scale * (_slot(codes, 0, 4) - zero)).to(OUT_TY),
            (scale * (_slot(codes, 1, 4) - zero)).to(OUT_TY),
        )
        v1 = tl.join(
            (scale * (_slot(codes, 2, 4) - zero)).to(OUT_TY),
            (scale * (_slot(codes, 3, 4) - zero)).to(OUT_TY),
        )
        v2 = tl.join(
            (scale * (_slot(codes, 4, 4) - zero)).to(OUT_TY),
            (scale * (_slot(codes, 5, 4) - zero)).to(OUT_TY),
        )
        v3 = tl.join(
            (scale * (_slot(codes, 6, 4) - zero)).to(OUT_TY),
            (scale * (_slot(codes, 7, 4) - zero)).to(OUT_TY),
        )
        every = tl.join(tl.join(v0, v1), tl.join(v2, v3))  # [BR, BQ, u, j, a, b]: slot 4b+2a+j
        tile = tl.reshape(tl.permute(every, (0, 1, 5, 4, 3, 2)), (BR, BQ * 32))
    else:
        v0 = tl.join(
            (scale * (_slot(codes, 0, 8) - zero)).to(OUT_TY),
            (scale * (_slot(codes, 1, 8) - zero)).to(OUT_TY),
        )
        v1 = tl.join(
            (scale * (_slot(codes, 2, 8) - zero)).to(OUT_TY),
            (scale * (_slot(codes, 3, 8) - zero)).to(OUT_TY),
        )
        every = tl.join(v0, v1)  # [BR, BQ, u, j, a]: slot 2a + j
        tile = tl.reshape(tl.permute(every, (0, 1, 4, 3, 2)), (BR, BQ * 16))
    cols = pid_q * BQ * QC + tl.arange(0, BQ * QC)
    out = out_ptr + out_rows.to(tl.int64)[:, None] * stride_out + cols[None, :]
    tl.store(out, tile, mask=row_ok[:, None] & (cols < n_quads * QC)[None, :])


def dequantize_triton(
    w: IntWeight,
    dtype: torch.dtype,
    *,
    ids: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The weight decoded into ``[rows, cols]`` of ``dtype`` in the layout's column order, or
    only rows ``ids`` (``[len(ids), cols]``). ``out`` (rows with unit column stride) receives
    it in place."""
    n = w.rows if ids is None else ids.numel()
    if out is None:
        out = torch.empty(n, w.cols, dtype=dtype, device=w.device)
    if n == 0:
        return out
    n_quads = w.cols // QUAD_COLUMNS[w.bits]
    grid = (triton.cdiv(n, BLOCK_ROWS), triton.cdiv(n_quads, BLOCK_QUADS))
    _dequant_kernel[grid](
        w.codes,
        w.scales,
        w.zeros if w.zeros is not None else w.scales,
        ids if ids is not None else w.codes,
        out,
        n,
        n_quads,
        w.codes.stride(0),
        w.scales.stride(0),
        out.stride(0),
        BR=BLOCK_ROWS,
        BQ=BLOCK_QUADS,
        BITS=w.bits,
        GROUP=w.group,
        ZEROS=w.zeros is not None,
        GATHER=ids is not None,
        num_warps=4,
    )
    return out
