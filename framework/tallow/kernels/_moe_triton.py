"""Triton kernels of the fused MoE (:mod:`tallow.kernels.moe` documents the contract).

- ``_softmax_topk_kernel``: the softmax top-k router in one launch (one program per token);
- alignment: ``_count_kernel`` (rows per expert, atomics), ``_offsets_kernel`` (one program:
  padded starts, the expert of every block, rows in use), ``_scatter_kernel`` (each row to
  its expert's next free slot, atomics);
- ``_moe_gemm_kernel``: the grouped GEMM over aligned blocks; with ``GATED`` it reads the gate
  and the up rows of ``w13`` into two accumulators and stores the activation; otherwise
  (down) it multiplies by the routing weight;
- ``_moe_gemv_kernel``: the gate/up product for a few tokens, one program per (row, output
  block): only the row's own expert is read; ``_moe_gemv_down_kernel``: the down product of a
  few tokens, one program per (token, output block) summing the token's experts.

The grouped GEMM's kernels take the row count as a runtime value (``step_jit``). Grids depend
on the token count only. The decode path's kernels (router, both GEMVs) follow the PDL rules
of :mod:`.pdl`: each waits for its predecessor before reading anything, since what it reads
(logits, expert ids, the intermediate) is the previous kernel's output.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import interpreting
from .jit import step_jit
from ._moe_layout import MOE_ACTIVATION_CODES as _ACT
from ._moe_layout import MoEAlignment, padded_capacity
from .moe_config import MoEConfig
from .moe_tiles import moe_block_ids, moe_block_rows, moe_epilogue, moe_store_rows
from .pdl import allow_next, pdl_enabled, wait_prior

_ALIGN_BLOCK = 256


@step_jit(values=("num_valid",))
def _count_kernel(ids_ptr, counts_ptr, num_valid, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < num_valid
    ids = tl.load(ids_ptr + offs, mask=mask, other=0)
    tl.atomic_add(counts_ptr + ids, tl.full([BLOCK], 1, tl.int32), mask=mask)


@step_jit(values=("num_blocks",))
def _offsets_kernel(
    counts_ptr,
    cursor_ptr,
    expert_ids_ptr,
    rows_used_ptr,
    num_experts,
    num_blocks,
    BLOCK_M: tl.constexpr,
    E_POW2: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    experts = tl.arange(0, E_POW2)
    real = experts < num_experts
    counts = tl.load(counts_ptr + experts, mask=real, other=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, 0)
    tl.store(cursor_ptr + experts, ends - padded, mask=real)
    tl.store(rows_used_ptr, tl.sum(padded, 0))
    for b0 in range(0, num_blocks, BLOCK_B):
        blocks = b0 + tl.arange(0, BLOCK_B)
        # a block's expert: how many experts' padded runs end at or before its first row
        before = (ends[None, :] <= (blocks * BLOCK_M)[:, None]) & real[None, :]
        expert = tl.minimum(tl.sum(before.to(tl.int32), 1), num_experts - 1)
        tl.store(expert_ids_ptr + blocks, expert, mask=blocks < num_blocks)


@step_jit(values=("num_valid",))
def _scatter_kernel(ids_ptr, cursor_ptr, sorted_ptr, num_valid, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < num_valid
    ids = tl.load(ids_ptr + offs, mask=mask, other=0)
    slot = tl.atomic_add(cursor_ptr + ids, tl.full([BLOCK], 1, tl.int32), mask=mask)
    tl.store(sorted_ptr + slot, offs.to(tl.int32), mask=mask)


@triton.jit
def _softmax_topk_kernel(
    logits_ptr,
    w_ptr,
    ids_ptr,
    num_experts,
    stride_t,
    scale,
    TOP_K: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    E_POW2: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """One token's router: softmax over its logits in float32, the ``TOP_K`` largest in
    descending order (the first index on ties), optionally renormalised, times ``scale``."""
    wait_prior(USE_PDL)  # the logits are the previous kernel's output
    allow_next(USE_PDL)
    token = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, E_POW2)
    x = tl.load(
        logits_ptr + token * stride_t + offs, mask=offs < num_experts, other=float("-inf")
    ).to(tl.float32)
    p = tl.exp(x - tl.max(x, 0))
    p = p / tl.sum(p, 0)
    denom = 1.0
    if RENORMALIZE:  # a first pass for the chosen weights' sum
        q = p
        denom = 0.0
        for _ in tl.static_range(TOP_K):
            v = tl.max(q, 0)
            denom += v
            q = tl.where(offs == tl.argmax(q, 0), -1.0, q)
    for j in tl.static_range(TOP_K):
        i = tl.argmax(p, 0)
        tl.store(w_ptr + token * TOP_K + j, tl.max(p, 0) / denom * scale)
        tl.store(ids_ptr + token * TOP_K + j, i.to(tl.int64))
        p = tl.where(offs == i, -1.0, p)


def softmax_topk_triton(
    logits: torch.Tensor, top_k: int, renormalize: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    tokens, experts = logits.shape
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(tokens, top_k, dtype=torch.int64, device=logits.device)
    if tokens:
        use_pdl = pdl_enabled(logits)
        _softmax_topk_kernel[(tokens,)](
            logits,
            weights,
            ids,
            experts,
            logits.stride(0),
            float(scale),
            TOP_K=top_k,
            RENORMALIZE=renormalize,
            E_POW2=triton.next_power_of_2(experts),
            USE_PDL=use_pdl,
            launch_pdl=use_pdl,
        )
    return weights, ids


def moe_align_triton(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> MoEAlignment:
    flat = topk_ids.reshape(-1)
    if flat.dtype not in (torch.int32, torch.int64):
        flat = flat.to(torch.int32)
    flat = flat.contiguous()
    num_valid = flat.numel()
    capacity = padded_capacity(num_valid, num_experts, block_m)
    num_blocks = capacity // block_m
    device = flat.device
    counts = torch.zeros(num_experts, dtype=torch.int32, device=device)
    cursor = torch.empty(num_experts, dtype=torch.int32, device=device)
    sorted_ids = torch.full((capacity,), num_valid, dtype=torch.int32, device=device)
    expert_ids = torch.empty(num_blocks, dtype=torch.int32, device=device)
    rows_used = torch.empty(1, dtype=torch.int32, device=device)
    grid = (triton.cdiv(num_valid, _ALIGN_BLOCK),)
    _count_kernel[grid](flat, counts, num_valid, BLOCK=_ALIGN_BLOCK)
    e_pow2 = triton.next_power_of_2(num_experts)
    _offsets_kernel[(1,)](
        counts,
        cursor,
        expert_ids,
        rows_used,
        num_experts,
        num_blocks,
        BLOCK_M=block_m,
        E_POW2=e_pow2,
        BLOCK_B=max(16, min(128, 8192 // e_pow2)),
    )
    _scatter_kernel[grid](flat, cursor, sorted_ids, num_valid, BLOCK=_ALIGN_BLOCK)
    return MoEAlignment(sorted_ids, expert_ids, rows_used, block_m, num_valid)


@step_jit(values=("num_valid",))
def _moe_gemm_kernel(
    a_ptr,
    w_ptr,
    bias_ptr,
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
    stride_be,
    stride_om,
    A_DIV: tl.constexpr,
    GATED: tl.constexpr,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST: tl.constexpr,
):
    pid_m, pid_n = moe_block_ids(N, BLOCK_N)
    if pid_m * BLOCK_M >= tl.load(rows_used_ptr):
        return  # past the experts' padded runs: the worst-case grid's idle tail
    rows, row_mask, expert, offs_n, n_mask = moe_block_rows(
        pid_m, pid_n, N, sorted_ptr, expert_ids_ptr, num_valid, BLOCK_M, BLOCK_N
    )
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (rows // A_DIV).to(tl.int64)[:, None] * stride_am + offs_k[None, :]
    w_ptrs = w_ptr + expert * stride_we + offs_n.to(tl.int64)[None, :] * stride_wn + offs_k[:, None]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        k_mask = (k + offs_k) < K
        a = tl.load(a_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        w = tl.load(w_ptrs, mask=k_mask[:, None] & n_mask[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            w = w.to(tl.float32)
        acc += tl.dot(a, w, input_precision=DOT_PRECISION)
        if GATED:  # the up rows sit N rows below the gate rows
            w_up = tl.load(
                w_ptrs + N * stride_wn, mask=k_mask[:, None] & n_mask[None, :], other=0.0
            )
            if UPCAST:
                w_up = w_up.to(tl.float32)
            up += tl.dot(a, w_up, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    b_ptr = bias_ptr + expert * stride_be
    acc = moe_epilogue(
        acc,
        up,
        b_ptr,
        b_ptr + N,
        topk_w_ptr,
        offs_n,
        n_mask,
        rows,
        row_mask,
        alpha,
        limit,
        GATED,
        ACT,
        HAS_BIAS,
        MUL_WEIGHT,
    )
    moe_store_rows(out_ptr, acc, rows, row_mask, offs_n, n_mask, stride_om)


@triton.jit
def _moe_gemv_kernel(
    a_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    ids_ptr,
    topk_w_ptr,
    N,
    K,
    alpha,
    limit,
    stride_am,
    stride_we,
    stride_wn,
    stride_be,
    stride_om,
    A_DIV: tl.constexpr,
    GATED: tl.constexpr,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # which expert's rows to stream is the router's output: nothing to prefetch before it
    wait_prior(USE_PDL)
    allow_next(USE_PDL)
    row = tl.program_id(0)
    expert = tl.load(ids_ptr + row).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (row // A_DIV).to(tl.int64) * stride_am + offs_k
    w_ptrs = w_ptr + expert * stride_we + offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    up = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        k_mask = (k + offs_k) < K
        a = tl.load(a_ptrs, mask=k_mask, other=0.0).to(tl.float32)[None, :]
        w_mask = n_mask[:, None] & k_mask[None, :]
        acc += tl.load(w_ptrs, mask=w_mask, other=0.0).to(tl.float32) * a
        if GATED:
            up += tl.load(w_ptrs + N * stride_wn, mask=w_mask, other=0.0).to(tl.float32) * a
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    rows = tl.full([1], 0, tl.int32) + row
    b_ptr = bias_ptr + expert * stride_be
    res = moe_epilogue(
        tl.sum(acc, 1)[None, :],
        tl.sum(up, 1)[None, :],
        b_ptr,
        b_ptr + N,
        topk_w_ptr,
        offs_n,
        n_mask,
        rows,
        rows >= 0,
        alpha,
        limit,
        GATED,
        ACT,
        HAS_BIAS,
        MUL_WEIGHT,
    )
    tl.store(
        out_ptr + row.to(tl.int64) * stride_om + offs_n[None, :],
        res.to(out_ptr.dtype.element_ty),
        mask=n_mask[None, :],
    )


@triton.jit
def _moe_gemv_down_kernel(
    a_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    ids_ptr,
    topk_w_ptr,
    N,
    K,
    stride_am,
    stride_we,
    stride_wn,
    stride_be,
    stride_om,
    TOP_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """The down product of a few tokens with the weighted sum over ``top_k`` fused: one
    program per (token, output block) runs the token's experts in slot order and sums their
    weighted outputs in float32, so no ``[T * top_k, H]`` buffer and no reduction kernel."""
    wait_prior(USE_PDL)
    allow_next(USE_PDL)
    token = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    total = tl.zeros([BLOCK_N], dtype=tl.float32)
    for slot in range(TOP_K):
        row = token * TOP_K + slot
        expert = tl.load(ids_ptr + row).to(tl.int64)
        a_ptrs = a_ptr + row.to(tl.int64) * stride_am + offs_k
        w_ptrs = (
            w_ptr + expert * stride_we + offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
        )
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            k_mask = (k + offs_k) < K
            a = tl.load(a_ptrs, mask=k_mask, other=0.0).to(tl.float32)[None, :]
            acc += (
                tl.load(w_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
                * a
            )
            a_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        y = tl.sum(acc, 1)
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


def _launch(
    kind: str,
    a: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    *,
    gated: bool,
    a_div: int,
    activation: str,
    alpha: float,
    limit: float,
    topk_w: torch.Tensor,
    ids: torch.Tensor,
    align: MoEAlignment | None,
    config: MoEConfig,
) -> None:
    n = w.shape[1] // 2 if gated else w.shape[1]
    k = w.shape[2]
    flags = dict(
        A_DIV=a_div,
        GATED=gated,
        ACT=_ACT[activation],
        HAS_BIAS=bias is not None,
        MUL_WEIGHT=not gated,
        BLOCK_N=config.block_n,
        BLOCK_K=config.block_k,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    b = bias if bias is not None else w
    b_stride = bias.stride(0) if bias is not None else 0
    if kind == "gemv":
        grid = (out.shape[0], triton.cdiv(n, config.block_n))
        use_pdl = pdl_enabled(a)
        _moe_gemv_kernel[grid](
            a,
            w,
            b,
            out,
            ids,
            topk_w,
            n,
            k,
            alpha,
            limit,
            a.stride(0),
            w.stride(0),
            w.stride(1),
            b_stride,
            out.stride(0),
            USE_PDL=use_pdl,
            launch_pdl=use_pdl,
            **flags,
        )
        return
    assert align is not None
    # Triton's interpreter multiplies bfloat16 tiles wrongly (3.7: garbage from tl.dot), so
    # there the tiles go to float32 first; float32 inputs take the exact product everywhere
    upcast = a.dtype == torch.float32 or (interpreting() and a.dtype == torch.bfloat16)
    programs = align.expert_ids.shape[0] * triton.cdiv(n, config.block_n)
    _moe_gemm_kernel[(programs,)](
        a,
        w,
        b,
        out,
        align.sorted_ids,
        align.expert_ids,
        align.rows_used,
        topk_w,
        n,
        k,
        align.num_valid,
        alpha,
        limit,
        a.stride(0),
        w.stride(0),
        w.stride(1),
        b_stride,
        out.stride(0),
        BLOCK_M=config.block_m,
        DOT_PRECISION="ieee" if upcast else "tf32",
        UPCAST=upcast,
        **flags,
    )


def fused_moe_triton(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str,
    w13_bias: torch.Tensor | None,
    w2_bias: torch.Tensor | None,
    alpha: float,
    limit: float,
    config: MoEConfig,
) -> torch.Tensor:
    """The fused MoE on the device (arguments checked by the caller)."""
    tokens, top_k = topk_ids.shape
    e, two_i, h = w13.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    if w13.stride(2) != 1 or w2.stride(2) != 1:
        raise ValueError("fused_moe: expert weights need contiguous rows")
    # the router's int64 ids and float32 weights are read as they are (no conversion kernels)
    ids = topk_ids.reshape(-1).contiguous()
    weights = topk_weights.reshape(-1).contiguous()
    align = (
        None
        if config.path == "gemv"
        else moe_align_triton(ids.view(tokens, top_k), e, config.block_m)
    )
    inter = torch.empty(tokens * top_k, two_i // 2, dtype=x.dtype, device=x.device)
    _launch(
        config.path,
        x,
        w13,
        w13_bias,
        inter,
        gated=True,
        a_div=top_k,
        activation=activation,
        alpha=float(alpha),
        limit=float(limit),
        topk_w=weights,
        ids=ids,
        align=align,
        config=config,
    )
    if config.path == "gemv":
        out = torch.empty(tokens, h, dtype=x.dtype, device=x.device)
        _moe_gemv_down_kernel[(tokens, triton.cdiv(h, config.block_n))](
            inter,
            w2,
            w2_bias if w2_bias is not None else w2,
            out,
            ids,
            weights,
            h,
            two_i // 2,
            inter.stride(0),
            w2.stride(0),
            w2.stride(1),
            w2_bias.stride(0) if w2_bias is not None else 0,
            out.stride(0),
            TOP_K=top_k,
            HAS_BIAS=w2_bias is not None,
            BLOCK_N=config.block_n,
            BLOCK_K=config.block_k,
            USE_PDL=pdl_enabled(x),
            launch_pdl=pdl_enabled(x),
            num_warps=config.num_warps,
        )
        return out
    out_k = torch.empty(tokens * top_k, h, dtype=x.dtype, device=x.device)
    _launch(
        config.path,
        inter,
        w2,
        w2_bias,
        out_k,
        gated=False,
        a_div=1,
        activation=activation,
        alpha=float(alpha),
        limit=float(limit),
        topk_w=weights,
        ids=ids,
        align=align,
        config=config,
    )
    # torch sums 16-bit tensors in float32 and rounds once: the reference's arithmetic
    return out_k.view(tokens, top_k, h).sum(1)
