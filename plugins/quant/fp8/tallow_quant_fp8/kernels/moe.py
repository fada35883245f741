"""Triton kernels of the fused MoE over e4m3 experts (:mod:`tallow_quant_fp8.moe_ops` documents
the contract and holds the torch reference).

Weights ``w [E, N, K]`` e4m3 with float32 scales per row (``s [E, N]``) or per 128 x 128 block
(``s [E, ceil(N/128), ceil(K/128)]``); the activations stay unquantized (weight-only).

- ``_gemv_gate_up_kernel``: a few tokens' gate/up product, one program per ((token, slot) row,
  block of outputs): only the row's own expert is read, its gate and up rows widened to
  float32 in registers, scaled, and SwiGLU (or gpt-oss's clamped variant) applied before the
  store;
- ``_gemv_down_kernel``: their down product, one program per (token, block of outputs)
  running the token's experts in slot order and adding their routing-weighted outputs in
  float32 (the top-k sum fused);
- ``_gemm_kernel``: the grouped GEMM over the core's expert-sorted blocks
  (:func:`tallow.kernels.moe_align`), the e4m3 tile widened to the activations' dtype in the
  K loop (exact: every e4m3 value is a bf16 and an fp16 value) and multiplied on the tensor
  cores; row scales multiply the accumulator once, block scales each 128-column step's
  product (``BLOCK_K`` divides 128). Gated: the activation is stored; down: times the routing
  weight, one row per (token, slot), summed over slots by the caller.

The decode kernels follow the PDL rules of :func:`tallow.kernels.wait_prior`: which expert to
read is the router's output, so they wait before reading anything.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tallow.kernels import (
    MOE_ACTIVATION_CODES,
    MoEConfig,
    allow_next,
    interpreting,
    moe_activate,
    moe_align,
    moe_block_ids,
    moe_block_rows,
    moe_epilogue,
    moe_store_rows,
    pdl_enabled,
    step_jit,
    wait_prior,
)

#: rows and columns of one scale block
SCALE_BLOCK = 128


@triton.jit
def _expert_rows(
    x_ptr,
    w_ptr,
    s_ptr,
    offs_n,
    n_mask,
    K,
    stride_wn,
    stride_sn,
    stride_sk,
    BLOCK_SCALE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """float32 ``[BLOCK_N]``: rows ``offs_n`` of one expert's weight (``w_ptr``, ``s_ptr`` at
    the expert) times the vector at ``x_ptr``."""
    offs_k = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        k_mask = (k + offs_k) < K
        a = tl.load(x_ptr + k + offs_k, mask=k_mask, other=0.0).to(tl.float32)[None, :]
        w = tl.load(w_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
        if BLOCK_SCALE:
            s = tl.load(
                s_ptr + (offs_n // 128) * stride_sn + (k // 128) * stride_sk, mask=n_mask, other=0.0
            )
            acc += w * a * s[:, None]
        else:
            acc += w * a
        w_ptrs += BLOCK_K
    total = tl.sum(acc, 1)
    if not BLOCK_SCALE:
        total = total * tl.load(s_ptr + offs_n * stride_sn, mask=n_mask, other=0.0)
    return total


@triton.jit
def _gemv_gate_up_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    out_ptr,
    ids_ptr,
    N,
    K,
    alpha,
    limit,
    stride_xm,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_sk,
    stride_om,
    TOP_K: tl.constexpr,
    ACT: tl.constexpr,
    BLOCK_SCALE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_prior(USE_PDL)
    allow_next(USE_PDL)
    row = tl.program_id(0)
    expert = tl.load(ids_ptr + row).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    x_row = x_ptr + (row // TOP_K).to(tl.int64) * stride_xm
    w_e = w_ptr + expert * stride_we
    s_e = s_ptr + expert * stride_se
    gate = _expert_rows(
        x_row,
        w_e,
        s_e,
        offs_n,
        n_mask,
        K,
        stride_wn,
        stride_sn,
        stride_sk,
        BLOCK_SCALE,
        BLOCK_N,
        BLOCK_K,
    )
    # the up rows sit N rows below the gate rows (N a multiple of 128 for block scales)
    up = _expert_rows(
        x_row,
        w_e,
        s_e,
        offs_n + N,
        n_mask,
        K,
        stride_wn,
        stride_sn,
        stride_sk,
        BLOCK_SCALE,
        BLOCK_N,
        BLOCK_K,
    )
    res = moe_activate(gate, up, alpha, limit, ACT)
    tl.store(
        out_ptr + row.to(tl.int64) * stride_om + offs_n,
        res.to(out_ptr.dtype.element_ty),
        mask=n_mask,
    )


@triton.jit
def _gemv_down_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    out_ptr,
    ids_ptr,
    topk_w_ptr,
    N,
    K,
    stride_xm,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_sk,
    stride_om,
    TOP_K: tl.constexpr,
    BLOCK_SCALE: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_prior(USE_PDL)
    allow_next(USE_PDL)
    token = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    total = tl.zeros([BLOCK_N], dtype=tl.float32)
    for slot in range(TOP_K):
        row = token * TOP_K + slot
        expert = tl.load(ids_ptr + row).to(tl.int64)
        y = _expert_rows(
            x_ptr + row.to(tl.int64) * stride_xm,
            w_ptr + expert * stride_we,
            s_ptr + expert * stride_se,
            offs_n,
            n_mask,
            K,
            stride_wn,
            stride_sn,
            stride_sk,
            BLOCK_SCALE,
            BLOCK_N,
            BLOCK_K,
        )
        total += y * tl.load(topk_w_ptr + row).to(tl.float32)
    tl.store(
        out_ptr + token.to(tl.int64) * stride_om + offs_n,
        total.to(out_ptr.dtype.element_ty),
        mask=n_mask,
    )


@triton.jit
def _tile_product(
    a,
    w_ptrs,
    s_ptr,
    offs_n,
    n_mask,
    k,
    k_mask,
    stride_sn,
    stride_sk,
    BLOCK_SCALE: tl.constexpr,
    UPCAST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One K step of the grouped GEMM: ``a [M, BK] @ w [BK, BN]`` with the e4m3 tile widened,
    times its block scales when the weight has them."""
    w = tl.load(w_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
    if UPCAST:
        w = w.to(tl.float32)
    else:
        w = w.to(a.dtype)
    p = tl.dot(a, w, input_precision=DOT_PRECISION)
    if BLOCK_SCALE:
        s = tl.load(
            s_ptr + (offs_n // 128) * stride_sn + (k // 128) * stride_sk, mask=n_mask, other=0.0
        )
        p = p * s[None, :]
    return p


@step_jit(values=("num_valid",))
def _gemm_kernel(
    a_ptr,
    w_ptr,
    s_ptr,
    out_ptr,
    sorted_ptr,
    expert_ids_ptr,
    rows_used_ptr,
    topk_w_ptr,
    N,
    K,
    num_valid,
    alpha,
    limit,
    stride_am,
    stride_we,
    stride_wn,
    stride_se,
    stride_sn,
    stride_sk,
    stride_om,
    A_DIV: tl.constexpr,
    GATED: tl.constexpr,
    ACT: tl.constexpr,
    BLOCK_SCALE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid_m, pid_n = moe_block_ids(N, BLOCK_N)
    if pid_m * BLOCK_M >= tl.load(rows_used_ptr):
        return  # past the experts' padded runs
    rows, row_mask, expert, offs_n, n_mask = moe_block_rows(
        pid_m, pid_n, N, sorted_ptr, expert_ids_ptr, num_valid, BLOCK_M, BLOCK_N
    )
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (rows // A_DIV).to(tl.int64)[:, None] * stride_am + offs_k[None, :]
    w_ptrs = w_ptr + expert * stride_we + offs_n.to(tl.int64)[None, :] * stride_wn + offs_k[:, None]
    s_e = s_ptr + expert * stride_se
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        k_mask = (k + offs_k) < K
        a = tl.load(a_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
        acc += _tile_product(
            a,
            w_ptrs,
            s_e,
            offs_n,
            n_mask,
            k,
            k_mask,
            stride_sn,
            stride_sk,
            BLOCK_SCALE,
            UPCAST,
            DOT_PRECISION,
        )
        if GATED:
            up += _tile_product(
                a,
                w_ptrs + N * stride_wn,
                s_e,
                offs_n + N,
                n_mask,
                k,
                k_mask,
                stride_sn,
                stride_sk,
                BLOCK_SCALE,
                UPCAST,
                DOT_PRECISION,
            )
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if not BLOCK_SCALE:
        acc = acc * tl.load(s_e + offs_n * stride_sn, mask=n_mask, other=0.0)[None, :]
        if GATED:
            up = up * tl.load(s_e + (offs_n + N) * stride_sn, mask=n_mask, other=0.0)[None, :]
    acc = moe_epilogue(
        acc,
        up,
        topk_w_ptr,
        topk_w_ptr,
        topk_w_ptr,
        offs_n,
        n_mask,
        rows,
        row_mask,
        alpha,
        limit,
        GATED,
        ACT,
        False,
        not GATED,
    )
    moe_store_rows(out_ptr, acc, rows, row_mask, offs_n, n_mask, stride_om)


def _scale_strides(scale: torch.Tensor, block: bool) -> tuple[int, int, int]:
    return (
        (scale.stride(0), scale.stride(1), scale.stride(2))
        if block
        else (scale.stride(0), scale.stride(1), 0)
    )


def fused_moe_fp8_triton(
    x: torch.Tensor,
    w13: torch.Tensor,
    s13: torch.Tensor,
    w2: torch.Tensor,
    s2: torch.Tensor,
    block: bool,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str,
    alpha: float,
    limit: float,
    config: MoEConfig,
) -> torch.Tensor:
    """The fused MoE over e4m3 experts on the device (arguments checked by the caller)."""
    tokens, top_k = topk_ids.shape
    e, two_i, h = w13.shape
    inter_n = two_i // 2
    x = x.contiguous()
    ids = topk_ids.reshape(-1).contiguous()
    weights = topk_weights.reshape(-1).contiguous()
    inter = torch.empty(tokens * top_k, inter_n, dtype=x.dtype, device=x.device)
    st13, st2 = _scale_strides(s13, block), _scale_strides(s2, block)
    act = MOE_ACTIVATION_CODES[activation]
    # block scales: one scale column per K step
    block_k = min(config.block_k, SCALE_BLOCK) if block else config.block_k
    if config.path == "gemv":
        use_pdl = pdl_enabled(x)
        launch = dict(
            BLOCK_SCALE=block,
            BLOCK_N=config.block_n,
            BLOCK_K=block_k,
            USE_PDL=use_pdl,
            launch_pdl=use_pdl,
            num_warps=config.num_warps,
        )
        _gemv_gate_up_kernel[(tokens * top_k, triton.cdiv(inter_n, config.block_n))](
            x,
            w13,
            s13,
            inter,
            ids,
            inter_n,
            h,
            float(alpha),
            float(limit),
            x.stride(0),
            w13.stride(0),
            w13.stride(1),
            *st13,
            inter.stride(0),
            TOP_K=top_k,
            ACT=act,
            **launch,
        )
        out = torch.empty(tokens, h, dtype=x.dtype, device=x.device)
        _gemv_down_kernel[(tokens, triton.cdiv(h, config.block_n))](
            inter,
            w2,
            s2,
            out,
            ids,
            weights,
            h,
            inter_n,
            inter.stride(0),
            w2.stride(0),
            w2.stride(1),
            *st2,
            out.stride(0),
            TOP_K=top_k,
            **launch,
        )
        return out
    align = moe_align(ids.view(tokens, top_k), e, config.block_m)
    # float32 activations take the exact product; the interpreter multiplies 16-bit tiles
    # wrongly, so there they go to float32 too
    upcast = x.dtype == torch.float32 or interpreting()
    common = dict(
        BLOCK_SCALE=block,
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        BLOCK_K=block_k,
        DOT_PRECISION="ieee" if upcast else "tf32",
        UPCAST=upcast,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    blocks_m = align.expert_ids.shape[0]
    _gemm_kernel[(blocks_m * triton.cdiv(inter_n, config.block_n),)](
        x,
        w13,
        s13,
        inter,
        align.sorted_ids,
        align.expert_ids,
        align.rows_used,
        weights,
        inter_n,
        h,
        align.num_valid,
        float(alpha),
        float(limit),
        x.stride(0),
        w13.stride(0),
        w13.stride(1),
        *st13,
        inter.stride(0),
        A_DIV=top_k,
        GATED=True,
        ACT=act,
        **common,
    )
    out_k = torch.empty(tokens * top_k, h, dtype=x.dtype, device=x.device)
    _gemm_kernel[(blocks_m * triton.cdiv(h, config.block_n),)](
        inter,
        w2,
        s2,
        out_k,
        align.sorted_ids,
        align.expert_ids,
        align.rows_used,
        weights,
        h,
        inter_n,
        align.num_valid,
        float(alpha),
        float(limit),
        inter.stride(0),
        w2.stride(0),
        w2.stride(1),
        *st2,
        out_k.stride(0),
        A_DIV=1,
        GATED=False,
        ACT=act,
        **common,
    )
    return out_k.view(tokens, top_k, h).sum(1)
