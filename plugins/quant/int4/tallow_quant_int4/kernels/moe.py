"""Triton kernels of the fused MoE over integer experts (:mod:`tallow_quant_int4.moe_ops`
documents the contract and holds the torch reference).

Each stacked weight ``[E, N, K]`` is the plugin's layout per row (:mod:`..layout`): int32 words
``codes [E, N, K * BITS / 32]`` in quads (column ``c`` of a row in word ``(c // QC) * 4 + c % 4``,
bits ``BITS * ((c % QC) // 4)`` on, ``QC = 128 / BITS`` columns per quad), ``scales [E, N,
K / GROUP]`` and, asymmetric, uint8 ``zeros [E, N, K / GROUP]`` (else the zero point is
``2 ** (BITS - 1)``). A weight is ``scale * (code - zero)``. ``BLOCK_K`` divides ``GROUP``,
so a K step reads one scale and one zero point per row.

- ``_gemv_gate_up_kernel`` / ``_gemv_down_kernel``: a few tokens, one program per ((token,
  slot) row | token, block of outputs), reading only the selected experts' codes and decoding
  them in registers: gate and up with SwiGLU (or gpt-oss's clamped variant) fused; down with
  the routing-weighted sum over the token's experts fused (slot order, float32).
- ``_gemm_kernel``: the grouped GEMM over the core's expert-sorted blocks
  (:func:`tallow.kernels.moe_align`): each K step decodes a ``[BLOCK_K, BLOCK_N]`` tile to
  ``code - zero`` (small integers, exact in the activations' dtype), multiplies it on the
  tensor cores and scales the partial product by the group's scales.
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


@triton.jit
def _centered(
    c_ptr,
    z_ptr,
    rows,
    cols,
    mask,
    g,
    stride_cn,
    stride_zn,
    BITS: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
):
    """``code - zero`` (float32) of the weights at ``rows`` x ``cols`` (broadcast shapes);
    ``g`` their group."""
    QC: tl.constexpr = 128 // BITS
    word = (cols // QC) * 4 + cols % 4
    shift = ((cols % QC) // 4) * BITS
    w = tl.load(c_ptr + rows.to(tl.int64) * stride_cn + word, mask=mask, other=0)
    code = ((w >> shift) & ((1 << BITS) - 1)).to(tl.float32)
    if HAS_ZEROS:
        zero = tl.load(z_ptr + rows.to(tl.int64) * stride_zn + g, mask=mask, other=0)
        return code - zero.to(tl.float32)
    return code - (1 << (BITS - 1))


@triton.jit
def _expert_rows(
    x_ptr,
    c_ptr,
    s_ptr,
    z_ptr,
    offs_n,
    n_mask,
    K,
    stride_cn,
    stride_sn,
    stride_zn,
    GROUP: tl.constexpr,
    BITS: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """float32 ``[BLOCK_N]``: rows ``offs_n`` of one expert's weight times the vector at
    ``x_ptr``."""
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        cols = k + offs_k
        k_mask = cols < K
        a = tl.load(x_ptr + cols, mask=k_mask, other=0.0).to(tl.float32)[None, :]
        g = k // GROUP
        q = _centered(
            c_ptr,
            z_ptr,
            offs_n[:, None],
            cols[None, :],
            n_mask[:, None] & k_mask[None, :],
            g,
            stride_cn,
            stride_zn,
            BITS,
            HAS_ZEROS,
        )
        s = tl.load(s_ptr + offs_n.to(tl.int64) * stride_sn + g, mask=n_mask, other=0.0).to(
            tl.float32
        )
        acc += q * a * s[:, None]
    return tl.sum(acc, 1)


@triton.jit
def _gemv_gate_up_kernel(
    x_ptr,
    c_ptr,
    s_ptr,
    z_ptr,
    out_ptr,
    ids_ptr,
    N,
    K,
    alpha,
    limit,
    stride_xm,
    stride_ce,
    stride_cn,
    stride_se,
    stride_sn,
    stride_ze,
    stride_zn,
    stride_om,
    TOP_K: tl.constexpr,
    ACT: tl.constexpr,
    GROUP: tl.constexpr,
    BITS: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
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
    c_e = c_ptr + expert * stride_ce
    s_e = s_ptr + expert * stride_se
    z_e = z_ptr + expert * stride_ze
    gate = _expert_rows(
        x_row,
        c_e,
        s_e,
        z_e,
        offs_n,
        n_mask,
        K,
        stride_cn,
        stride_sn,
        stride_zn,
        GROUP,
        BITS,
        HAS_ZEROS,
        BLOCK_N,
        BLOCK_K,
    )
    up = _expert_rows(
        x_row,
        c_e,
        s_e,
        z_e,
        offs_n + N,
        n_mask,
        K,
        stride_cn,
        stride_sn,
        stride_zn,
        GROUP,
        BITS,
        HAS_ZEROS,
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
    c_ptr,
    s_ptr,
    z_ptr,
    out_ptr,
    ids_ptr,
    topk_w_ptr,
    N,
    K,
    stride_xm,
    stride_ce,
    stride_cn,
    stride_se,
    stride_sn,
    stride_ze,
    stride_zn,
    stride_om,
    TOP_K: tl.constexpr,
    GROUP: tl.constexpr,
    BITS: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
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
            c_ptr + expert * stride_ce,
            s_ptr + expert * stride_se,
            z_ptr + expert * stride_ze,
            offs_n,
            n_mask,
            K,
            stride_cn,
            stride_sn,
            stride_zn,
            GROUP,
            BITS,
            HAS_ZEROS,
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
    c_ptr,
    s_ptr,
    z_ptr,
    offs_n,
    n_mask,
    cols,
    k_mask,
    g,
    stride_cn,
    stride_sn,
    stride_zn,
    GROUP: tl.constexpr,
    BITS: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """One K step of the grouped GEMM: ``a [M, BK] @ (code - zero) [BK, BN]`` times the
    group's scales."""
    q = _centered(
        c_ptr,
        z_ptr,
        offs_n[None, :],
        cols[:, None],
        k_mask[:, None] & n_mask[None, :],
        g,
        stride_cn,
        stride_zn,
        BITS,
        HAS_ZEROS,
    )
    p = tl.dot(a, q.to(a.dtype), input_precision=DOT_PRECISION)
    s = tl.load(s_ptr + offs_n.to(tl.int64) * stride_sn + g, mask=n_mask, other=0.0)
    return p * s.to(tl.float32)[None, :]


@step_jit(values=("num_valid",))
def _gemm_kernel(
    a_ptr,
    c_ptr,
    s_ptr,
    z_ptr,
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
    stride_ce,
    stride_cn,
    stride_se,
    stride_sn,
    stride_ze,
    stride_zn,
    stride_om,
    A_DIV: tl.constexpr,
    GATED: tl.constexpr,
    ACT: tl.constexpr,
    GROUP: tl.constexpr,
    BITS: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
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
    c_e = c_ptr + expert * stride_ce
    s_e = s_ptr + expert * stride_se
    z_e = z_ptr + expert * stride_ze
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        cols = k + offs_k
        k_mask = cols < K
        a = tl.load(a_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
        g = k // GROUP
        acc += _tile_product(
            a,
            c_e,
            s_e,
            z_e,
            offs_n,
            n_mask,
            cols,
            k_mask,
            g,
            stride_cn,
            stride_sn,
            stride_zn,
            GROUP,
            BITS,
            HAS_ZEROS,
            DOT_PRECISION,
        )
        if GATED:  # the up rows sit N rows below the gate rows
            up += _tile_product(
                a,
                c_e,
                s_e,
                z_e,
                offs_n + N,
                n_mask,
                cols,
                k_mask,
                g,
                stride_cn,
                stride_sn,
                stride_zn,
                GROUP,
                BITS,
                HAS_ZEROS,
                DOT_PRECISION,
            )
        a_ptrs += BLOCK_K
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


def _weight_args(w) -> tuple[list, dict]:  # w: a StackedInt (moe_ops imports this module)
    zeros = w.zeros if w.zeros is not None else w.scales
    args = [w.codes, w.scales, zeros]
    strides = [
        w.codes.stride(0),
        w.codes.stride(1),
        w.scales.stride(0),
        w.scales.stride(1),
        zeros.stride(0),
        zeros.stride(1),
    ]
    return args + strides, dict(GROUP=w.group, BITS=w.bits, HAS_ZEROS=w.zeros is not None)


def fused_moe_int_triton(
    x: torch.Tensor,
    w13,
    w2,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str,
    alpha: float,
    limit: float,
    config: MoEConfig,
) -> torch.Tensor:
    """The fused MoE over integer experts (``w13``, ``w2``: StackedInt) on the device
    (arguments checked by the caller)."""
    tokens, top_k = topk_ids.shape
    e, two_i, h = w13.shape
    inter_n = two_i // 2
    x = x.contiguous()
    ids = topk_ids.reshape(-1).contiguous()
    weights = topk_weights.reshape(-1).contiguous()
    inter = torch.empty(tokens * top_k, inter_n, dtype=x.dtype, device=x.device)
    act = MOE_ACTIVATION_CODES[activation]
    (c13, s13, z13, *st13), flags13 = _weight_args(w13)
    (c2, s2, z2, *st2), flags2 = _weight_args(w2)
    if config.path == "gemv":
        use_pdl = pdl_enabled(x)
        launch = dict(
            BLOCK_N=config.block_n, USE_PDL=use_pdl, launch_pdl=use_pdl, num_warps=config.num_warps
        )
        _gemv_gate_up_kernel[(tokens * top_k, triton.cdiv(inter_n, config.block_n))](
            x,
            c13,
            s13,
            z13,
            inter,
            ids,
            inter_n,
            h,
            float(alpha),
            float(limit),
            x.stride(0),
            *st13,
            inter.stride(0),
            TOP_K=top_k,
            ACT=act,
            BLOCK_K=min(config.block_k, w13.group),
            **flags13,
            **launch,
        )
        out = torch.empty(tokens, h, dtype=x.dtype, device=x.device)
        _gemv_down_kernel[(tokens, triton.cdiv(h, config.block_n))](
            inter,
            c2,
            s2,
            z2,
            out,
            ids,
            weights,
            h,
            inter_n,
            inter.stride(0),
            *st2,
            out.stride(0),
            TOP_K=top_k,
            BLOCK_K=min(config.block_k, w2.group),
            **flags2,
            **launch,
        )
        return out
    align = moe_align(ids.view(tokens, top_k), e, config.block_m)
    # float32 activations take the exact product; the interpreter multiplies 16-bit tiles
    # wrongly, so there they go to float32 too
    upcast = x.dtype == torch.float32 or interpreting()
    common = dict(
        BLOCK_M=config.block_m,
        BLOCK_N=config.block_n,
        DOT_PRECISION="ieee" if upcast else "tf32",
        UPCAST=upcast,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    blocks_m = align.expert_ids.shape[0]
    _gemm_kernel[(blocks_m * triton.cdiv(inter_n, config.block_n),)](
        x,
        c13,
        s13,
        z13,
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
        *st13,
        inter.stride(0),
        A_DIV=top_k,
        GATED=True,
        ACT=act,
        BLOCK_K=min(config.block_k, w13.group),
        **flags13,
        **common,
    )
    out_k = torch.empty(tokens * top_k, h, dtype=x.dtype, device=x.device)
    _gemm_kernel[(blocks_m * triton.cdiv(h, config.block_n),)](
        inter,
        c2,
        s2,
        z2,
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
        *st2,
        out_k.stride(0),
        A_DIV=1,
        GATED=False,
        ACT=act,
        BLOCK_K=min(config.block_k, w2.group),
        **flags2,
        **common,
    )
    return out_k.view(tokens, top_k, h).sum(1)
