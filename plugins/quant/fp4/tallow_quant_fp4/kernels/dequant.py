"""An FP4 weight (or some of its rows) decoded into a float tensor: the workspace that large
batches multiply with cuBLAS. Each thread decodes whole quads and writes each quad's 32 values
in column order; the values are ``value * scale`` in float32 rounded once to the output dtype
(the reference's bits)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..layout import FP4Weight
from .decode import e2m1, scale_value

BLOCK_ROWS = 8
BLOCK_QUADS = 16


@triton.jit
def _dequant_kernel(
    q_ptr,
    s_ptr,
    out_ptr,
    N,
    n_quads,
    stride_q,
    stride_s,
    stride_out,
    global_scale,
    BR: tl.constexpr,
    BQ: tl.constexpr,
    NV: tl.constexpr,
):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    quads = tl.program_id(1) * BQ + tl.arange(0, BQ)
    mask2 = (rows < N)[:, None] & (quads < n_quads)[None, :]
    r2 = rows.to(tl.int64)[:, None]
    u = tl.arange(0, 4)[None, None, :]
    codes = tl.load(
        q_ptr + r2[:, :, None] * stride_q + quads[None, :, None] * 4 + u,
        mask=mask2[:, :, None],
        other=0,
    )
    if NV:
        s0 = tl.load(s_ptr + r2 * stride_s + 2 * quads[None, :], mask=mask2, other=0)
        s1 = tl.load(s_ptr + r2 * stride_s + 2 * quads[None, :] + 1, mask=mask2, other=0)
    else:
        s0 = tl.load(s_ptr + r2 * stride_s + quads[None, :], mask=mask2, other=0)
        s1 = s0
    a = scale_value(s0, global_scale, NV)[:, :, None]
    b = scale_value(s1, global_scale, NV)[:, :, None]
    OUT_TY: tl.constexpr = out_ptr.dtype.element_ty
    v0 = tl.join((e2m1(codes) * a).to(OUT_TY), (e2m1(codes >> 4) * a).to(OUT_TY))
    v1 = tl.join((e2m1(codes >> 8) * a).to(OUT_TY), (e2m1(codes >> 12) * a).to(OUT_TY))
    v2 = tl.join((e2m1(codes >> 16) * b).to(OUT_TY), (e2m1(codes >> 20) * b).to(OUT_TY))
    v3 = tl.join((e2m1(codes >> 24) * b).to(OUT_TY), (e2m1(codes >> 28) * b).to(OUT_TY))
    every = tl.join(tl.join(v0, v1), tl.join(v2, v3))  # [BR, BQ, u, j, a, b]: slot 4b+2a+j
    tile = tl.reshape(tl.permute(every, (0, 1, 5, 4, 3, 2)), (BR, BQ * 32))
    cols = tl.program_id(1) * BQ * 32 + tl.arange(0, BQ * 32)
    out = out_ptr + rows.to(tl.int64)[:, None] * stride_out + cols[None, :]
    tl.store(out, tile, mask=(rows < N)[:, None] & (cols < n_quads * 32)[None, :])


def dequantize_triton(w: FP4Weight, dtype: torch.dtype) -> torch.Tensor:
    """The weight decoded into ``[rows, cols]`` of ``dtype``."""
    out = torch.empty(w.rows, w.cols, dtype=dtype, device=w.device)
    if w.rows == 0:
        return out
    n_quads = w.cols // 32
    grid = (triton.cdiv(w.rows, BLOCK_ROWS), triton.cdiv(n_quads, BLOCK_QUADS))
    _dequant_kernel[grid](
        w.codes,
        w.scales,
        out,
        w.rows,
        n_quads,
        w.codes.stride(0),
        w.scales.stride(0),
        out.stride(0),
        w.global_scale,
        BR=BLOCK_ROWS,
        BQ=BLOCK_QUADS,
        NV=w.kind == "nvfp4",
        num_warps=4,
    )
    return out
