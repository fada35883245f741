"""Triton kernel of :mod:`tallow.kernels.gated_norm`: one program per block of rows."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .jit import step_jit

ROWS = 8


@step_jit(values=("num_rows", "stride_x", "stride_z"), pointers=("x_ptr", "z_ptr", "out_ptr"))
def _gated_rms_norm(
    x_ptr,
    z_ptr,
    w_ptr,
    out_ptr,
    num_rows,
    width,
    stride_x,
    stride_z,
    eps,
    ROWS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    mask = (rows < num_rows)[:, None] & (cols < width)[None, :]
    rows64 = rows.to(tl.int64)
    x = tl.load(x_ptr + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    xf = x.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(xf * xf, axis=1) / width + eps)
    w = tl.load(w_ptr + cols, mask=cols < width, other=0.0).to(x_ptr.dtype.element_ty)
    # rounded as transformers does: the normalised row, then its product with the weight
    y = ((xf * rstd[:, None]).to(x_ptr.dtype.element_ty) * w[None, :]).to(tl.float32)
    z = tl.load(z_ptr + rows64[:, None] * stride_z + cols[None, :], mask=mask, other=0.0).to(
        tl.float32
    )
    y = y * (z / (1.0 + tl.exp(-z)))
    tl.store(
        out_ptr + rows64[:, None] * width + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask
    )


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as ``[rows, width]`` without a copy where its rows are evenly spaced."""
    width = t.shape[-1]
    if t.stride(-1) == 1:
        try:
            return t.view(-1, width)
        except RuntimeError:
            pass
    return t.reshape(-1, width).contiguous()


def gated_rms_norm_triton(
    x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    x2, z2 = _rows(x), _rows(z)
    num_rows, width = x2.shape
    out = torch.empty((num_rows, width), dtype=x.dtype, device=x.device)
    _gated_rms_norm[(triton.cdiv(num_rows, ROWS),)](
        x2,
        z2,
        weight,
        out,
        num_rows,
        width,
        x2.stride(0),
        z2.stride(0),
        float(eps),
        ROWS=ROWS,
        BLOCK=triton.next_power_of_2(width),
    )
    return out.view(x.shape)
