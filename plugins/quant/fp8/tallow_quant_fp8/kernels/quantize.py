"""Activations to e4m3 for the W8A8 matmuls: one program per row.

- Per token (``GROUP == 0``): a first pass over the row finds ``amax``, ``scale = amax / 448``
  (at least :data:`~tallow_quant_fp8.weights.MIN_SCALE`), a second writes ``x / scale``.
- Per token and 128-column group (``GROUP == 128``, block-wise weights): each chunk of the row
  holds whole groups, so one pass finds each group's scale and writes its values.
- Static (``STATIC``): the checkpoint's scale for every row.

Every value is ``x / scale`` in IEEE float32 rounded to nearest even (after clamping to +-448),
so the bits equal :func:`tallow_quant_fp8.reference.quantize_activations_ref`'s. Scales go to
``s_ptr + row * stride_sm + group * stride_sg``: row-major for the Triton GEMM, column-major
("outer-dim-major") for ``torch._scaled_mm``'s 1 x 128 scaling.

With ``GATE`` (a kind of :data:`tallow.kernels.ACTIVATION_KINDS`) each row of x is
``[gate | up]``, ``K`` wide each, and the value quantized is ``act(gate) * up`` rounded to x's
dtype, exactly as the activation kernel computes it: a gated MLP's down projection reads its
input once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tallow.kernels import ACTIVATION_KINDS as KINDS, gated_value, step_jit

from ..weights import BLOCK, FP8, MIN_SCALE
from .common import quantize_value

_CHUNK = 2048


@triton.jit
def _load(x_ptrs, mask, K, GATE: tl.constexpr, X_TY: tl.constexpr):
    x = tl.load(x_ptrs, mask=mask, other=0.0)
    if GATE >= 0:
        up = tl.load(x_ptrs + K, mask=mask, other=0.0)
        x = gated_value(x, up, GATE, X_TY)
    return x.to(tl.float32)


@step_jit(values=("M",))
def _quantize_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    static_ptr,
    M,
    K,
    stride_xm,
    stride_qm,
    stride_sm,
    stride_sg,
    GROUP: tl.constexpr,
    CHUNK: tl.constexpr,
    STATIC: tl.constexpr,
    GATE: tl.constexpr,
    MIN_S: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_xm
    q_row = q_ptr + row * stride_qm
    offs = tl.arange(0, CHUNK)
    x_ty = x_ptr.dtype.element_ty
    if GROUP > 0:
        # whole groups per chunk: one pass
        G: tl.constexpr = CHUNK // GROUP
        for k in range(0, K, CHUNK):
            mask = (k + offs) < K
            x = _load(x_row + k + offs, mask, K, GATE, x_ty)
            xg = tl.reshape(x, (G, GROUP))
            if STATIC:
                scale = tl.zeros((G,), tl.float32) + tl.load(static_ptr)
            else:
                scale = tl.maximum(tl.math.div_rn(tl.max(tl.abs(xg), axis=1), 448.0), MIN_S)
            q = quantize_value(xg, scale[:, None])
            tl.store(q_row + k + offs, tl.reshape(q, (CHUNK,)), mask=mask)
            groups = k // GROUP + tl.arange(0, G)
            tl.store(s_ptr + row * stride_sm + groups * stride_sg, scale, mask=groups * GROUP < K)
    else:
        if STATIC:
            scale = tl.load(static_ptr)
        else:
            amax = tl.zeros((CHUNK,), tl.float32)
            for k in range(0, K, CHUNK):
                x = _load(x_row + k + offs, (k + offs) < K, K, GATE, x_ty)
                amax = tl.maximum(amax, tl.abs(x))
            scale = tl.maximum(tl.math.div_rn(tl.max(amax, axis=0), 448.0), MIN_S)
        for k in range(0, K, CHUNK):
            mask = (k + offs) < K
            x = _load(x_row + k + offs, mask, K, GATE, x_ty)
            tl.store(q_row + k + offs, quantize_value(x, scale), mask=mask)
        tl.store(s_ptr + row * stride_sm, scale)


def quantize_activations_triton(
    x: torch.Tensor,
    *,
    group: int | None = None,
    static_scale: torch.Tensor | None = None,
    gate: str | None = None,
    scales_column_major: bool = False,
    row_multiple: int = 1,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` (or ``[M, 2K]`` with ``gate``) as (e4m3 ``[M, K]``, float32 scales
    ``[M, G]``), G = 1 per token (``group`` None) or ``K / 128``; ``static_scale`` a float32
    one-element tensor. ``scales_column_major`` lays the scales out with stride ``(1, M)``.
    ``row_multiple`` pads both to a multiple of that many rows (zeros, scales of one), for a
    consumer that needs it (cuBLAS's block-scaled GEMM: 4)."""
    m, width = x.shape
    rows = -(-m // row_multiple) * row_multiple
    k = width // 2 if gate is not None else width
    if group is not None and (group != BLOCK or k % BLOCK):
        raise ValueError(
            f"activation groups must be {BLOCK} columns dividing K, got group {group} for K = {k}"
        )
    if x.stride(1) != 1:
        x = x.contiguous()
    groups = 1 if group is None else k // group
    q = torch.empty(rows, k, dtype=FP8, device=x.device)
    if scales_column_major:
        scales = torch.empty(groups, rows, dtype=torch.float32, device=x.device).t()
    else:
        scales = torch.empty(rows, groups, dtype=torch.float32, device=x.device)
    if rows > m:
        q[m:].view(torch.uint8).zero_()
        scales[m:].fill_(1.0)
    if m == 0:
        return q, scales
    chunk = min(_CHUNK, max(BLOCK, triton.next_power_of_2(k)))
    _quantize_kernel[(m,)](
        x,
        q,
        scales,
        static_scale if static_scale is not None else scales,
        m,
        k,
        x.stride(0),
        q.stride(0),
        scales.stride(0),
        scales.stride(1),
        GROUP=group or 0,
        CHUNK=chunk,
        STATIC=static_scale is not None,
        GATE=-1 if gate is None else KINDS[gate],
        MIN_S=MIN_SCALE,
        num_warps=4 if chunk >= 1024 else 2,
    )
    return q, scales
