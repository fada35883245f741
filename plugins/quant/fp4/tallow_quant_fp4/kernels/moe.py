"""Triton kernels of the MXFP4 mixture-of-experts experts (:mod:`tallow_quant_fp4.moe_ops`
documents the layout and the arithmetic).

- ``_gate_up_kernel``: a few tokens' gate/up products, one program per (token-expert row,
  block of output features): only the row's own expert's bytes are read, decoded in
  registers, and the activation applied to the gate and up sums before the store;
- ``_down_kernel``: the down product of a few tokens with the routing weights and the sum over
  each token's experts fused: one program per (token, block of output features) runs the
  token's experts in slot order and adds them in float32;
- ``_dequant_kernel``: the experts that the routing selects decoded into a float workspace
  for the grouped GEMM of larger batches; programs of an unselected expert return at once,
  so the launch needs no host sync and fits a CUDA graph.

Each weight row is ``K / 2`` bytes, two e2m1 codes a byte (the even column in the low nibble),
with an e8m0 scale byte per 32 columns. A tile is ``[rows, GROUPS, 16]`` bytes: the even
columns' codes multiply the even activations and the odd ones the odd, each group's sum is
scaled once.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tallow.kernels import moe_activate

from .decode import e2m1, scale_value


@triton.jit
def _mx_rows_dot(
    w_ptr,
    s_ptr,
    x_ptr,
    offs_n,
    n_mask,
    n_groups,
    stride_wn,
    stride_sn,
    BLOCK_N: tl.constexpr,
    GROUPS: tl.constexpr,
):
    """float32 ``[BLOCK_N]``: rows ``offs_n`` of an MXFP4 matrix (bytes at ``w_ptr``, scale
    bytes at ``s_ptr``) times the ``32 * n_groups`` activations at ``x_ptr``."""
    offs_g = tl.arange(0, GROUPS)
    offs_b = tl.arange(0, 16)
    rows = offs_n.to(tl.int64)
    acc = tl.zeros([BLOCK_N, GROUPS], dtype=tl.float32)
    for g0 in range(0, n_groups, GROUPS):
        g = g0 + offs_g
        g_mask = g < n_groups
        mask3 = n_mask[:, None, None] & g_mask[None, :, None]
        byte = tl.load(
            w_ptr + rows[:, None, None] * stride_wn + g[None, :, None] * 16 + offs_b[None, None, :],
            mask=mask3,
            other=0,
        ).to(tl.int32)
        x_even = tl.load(
            x_ptr + g[:, None] * 32 + offs_b[None, :] * 2, mask=g_mask[:, None], other=0.0
        ).to(tl.float32)
        x_odd = tl.load(
            x_ptr + g[:, None] * 32 + offs_b[None, :] * 2 + 1, mask=g_mask[:, None], other=0.0
        ).to(tl.float32)
        part = tl.sum(e2m1(byte) * x_even[None, :, :] + e2m1(byte >> 4) * x_odd[None, :, :], 2)
        s = tl.load(
            s_ptr + rows[:, None] * stride_sn + g[None, :],
            mask=n_mask[:, None] & g_mask[None, :],
            other=0,
        )
        acc += part * scale_value(s, 1.0, False)
    return tl.sum(acc, 1)


@triton.jit
def _gate_up_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    bias_ptr,
    out_ptr,
    ids_ptr,
    N,
    n_groups,
    alpha,
    limit,
    stride_xm,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_be,
    stride_om,
    TOP_K: tl.constexpr,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUPS: tl.constexpr,
):
    row = tl.program_id(0)  # token * TOP_K + slot
    expert = tl.load(ids_ptr + row).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    x = x_ptr + (row // TOP_K).to(tl.int64) * stride_xm
    w = w_ptr + expert * stride_we
    s = s_ptr + expert * stride_se
    gate = _mx_rows_dot(w, s, x, offs_n, n_mask, n_groups, stride_wn, stride_sn, BLOCK_N, GROUPS)
    up = _mx_rows_dot(w, s, x, offs_n + N, n_mask, n_groups, stride_wn, stride_sn, BLOCK_N, GROUPS)
    if HAS_BIAS:
        b = bias_ptr + expert * stride_be
        gate += tl.load(b + offs_n, mask=n_mask, other=0.0).to(tl.float32)
        up += tl.load(b + N + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    h = moe_activate(gate, up, alpha, limit, ACT)
    tl.store(
        out_ptr + row.to(tl.int64) * stride_om + offs_n, h.to(out_ptr.dtype.element_ty), mask=n_mask
    )


@triton.jit
def _down_kernel(
    a_ptr,
    w_ptr,
    s_ptr,
    bias_ptr,
    out_ptr,
    ids_ptr,
    topk_w_ptr,
    N,
    n_groups,
    stride_am,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_be,
    stride_om,
    TOP_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUPS: tl.constexpr,
):
    token = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    total = tl.zeros([BLOCK_N], dtype=tl.float32)
    for slot in range(TOP_K):
        row = token * TOP_K + slot
        expert = tl.load(ids_ptr + row).to(tl.int64)
        y = _mx_rows_dot(
            w_ptr + expert * stride_we,
            s_ptr + expert * stride_se,
            a_ptr + row.to(tl.int64) * stride_am,
            offs_n,
            n_mask,
            n_groups,
            stride_wn,
            stride_sn,
            BLOCK_N,
            GROUPS,
        )
        if HAS_BIAS:
            y += tl.load(bias_ptr + expert * stride_be + offs_n, mask=n_mask, other=0.0).to(
                tl.float32
            )
        total += y * tl.load(topk_w_ptr + row).to(tl.float32)
    tl.store(
        out_ptr + token.to(tl.int64) * stride_om + offs_n,
        total.to(out_ptr.dtype.element_ty),
        mask=n_mask,
    )


@triton.jit
def _dequant_kernel(
    w_ptr,
    s_ptr,
    used_ptr,
    out_ptr,
    R,
    n_groups,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_oe,
    stride_on,
    BLOCK_R: tl.constexpr,
    GROUPS: tl.constexpr,
):
    expert = tl.program_id(0)
    if tl.load(used_ptr + expert) == 0:
        return  # no token is routed to this expert: its workspace rows are never read
    rows = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    r_mask = rows < R
    e64 = expert.to(tl.int64)
    r64 = rows.to(tl.int64)
    offs_g = tl.arange(0, GROUPS)
    offs_b = tl.arange(0, 16)
    for g0 in range(0, n_groups, GROUPS):
        g = g0 + offs_g
        mask2 = r_mask[:, None] & (g < n_groups)[None, :]
        mask3 = mask2[:, :, None]
        byte = tl.load(
            w_ptr
            + e64 * stride_we
            + r64[:, None, None] * stride_wn
            + g[None, :, None] * 16
            + offs_b[None, None, :],
            mask=mask3,
            other=0,
        ).to(tl.int32)
        s = scale_value(
            tl.load(
                s_ptr + e64 * stride_se + r64[:, None] * stride_sn + g[None, :], mask=mask2, other=0
            ),
            1.0,
            False,
        )[:, :, None]
        col = g[None, :, None] * 32 + offs_b[None, None, :] * 2
        dst = out_ptr + e64 * stride_oe + r64[:, None, None] * stride_on + col
        ty = out_ptr.dtype.element_ty
        tl.store(dst, (e2m1(byte) * s).to(ty), mask=mask3)
        tl.store(dst + 1, (e2m1(byte >> 4) * s).to(ty), mask=mask3)
