"""The pieces every fused-MoE kernel shares, whatever its experts' weight format.

A quantized-experts plugin writes only what is its own — how a tile of its weights is read and
multiplied — and takes the rest from here, so that the routing, the gated activation and the
routing weight are computed the same way by the core's bf16 kernels and every format's.
These are Triton device functions (``@triton.jit``, called from a plugin's kernels); the host
side (:func:`tallow.kernels.check_moe_routing`, ``MOE_ACTIVATION_CODES``) lives in
:mod:`tallow.kernels.moe`.

- :func:`moe_activate` (SwiGLU, gpt-oss's clamped variant, GeGLU), :func:`moe_epilogue` (bias,
  activation or routing weight on float32 accumulators), :func:`moe_block_ids` and
  :func:`moe_block_rows` (which aligned block of :func:`tallow.kernels.moe_align`'s rows a
  grouped-GEMM program owns), :func:`moe_store_rows` (the masked store of a block).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def moe_activate(gate, up, alpha, limit, ACT: tl.constexpr):
    """The gated activation of float32 ``gate`` and ``up``: SwiGLU (``ACT`` 0), gpt-oss's
    clamped SwiGLU (``ACT`` 1: gate clamped above, up both sides, ``sigmoid(alpha * gate)``)
    or GeGLU with the tanh approximation of GELU (``ACT`` 2, Gemma 4's experts)."""
    if ACT == 0:
        return gate / (1.0 + tl.exp(-gate)) * up
    if ACT == 2:
        # tanh(z) = 1 - 2 / (exp(2z) + 1): exact limits at both ends, no overflow to nan
        z = 0.7978845608028654 * (gate + 0.044715 * gate * gate * gate)
        return 0.5 * gate * (2.0 - 2.0 / (tl.exp(2.0 * z) + 1.0)) * up
    g = tl.minimum(gate, limit)
    u = tl.minimum(tl.maximum(up, -limit), limit)
    return (u + 1.0) * (g / (1.0 + tl.exp(-alpha * g)))


@triton.jit
def moe_epilogue(
    acc,
    up,
    bias_ptr,
    b_up_ptr,
    w_row_ptr,
    offs_n,
    n_mask,
    rows,
    row_mask,
    alpha,
    limit,
    GATED: tl.constexpr,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
):
    """Bias (``HAS_BIAS``), then the gated activation (``GATED``) or the routing weight of each
    row (``MUL_WEIGHT``), on float32 accumulators ``[rows, offs_n]``."""
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        if GATED:
            up += tl.load(b_up_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    if GATED:
        acc = moe_activate(acc, up, alpha, limit, ACT)
    if MUL_WEIGHT:
        acc = acc * tl.load(w_row_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)[:, None]
    return acc


@triton.jit
def moe_block_ids(N, BLOCK_N: tl.constexpr):
    """(block of aligned rows, block of outputs) of this grouped-GEMM program (a 1-d grid of
    ``blocks_m * cdiv(N, BLOCK_N)``). A program whose row block starts past
    ``moe_align``'s ``rows_used`` has nothing to do: the caller returns."""
    pid = tl.program_id(0)
    blocks_n = tl.cdiv(N, BLOCK_N)
    return pid // blocks_n, pid % blocks_n


@triton.jit
def moe_block_rows(
    pid_m,
    pid_n,
    N,
    sorted_ptr,
    expert_ids_ptr,
    num_valid,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The rows (``(token, slot)`` indices, masked past ``num_valid``), the expert and the
    output columns of block ``(pid_m, pid_n)``: ``rows, row_mask, expert, offs_n, n_mask``."""
    rows = tl.load(sorted_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    row_mask = rows < num_valid
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    return rows, row_mask, expert, offs_n, n_mask


@triton.jit
def moe_store_rows(out_ptr, acc, rows, row_mask, offs_n, n_mask, stride_om):
    """Store float32 ``acc [rows, offs_n]`` into ``out`` (its dtype) at those rows."""
    out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & n_mask[None, :])
