"""The few-token expert MLP of a mixture of experts whose experts are GGML blocks: the GEMV
(:mod:`~tallow_quant_gguf.kernels.gemv`) with an expert index.

The experts of one projection are stacked along the rows of one
:class:`~tallow_quant_gguf.packing.PackedWeight`: expert ``e`` owns rows ``e * R .. (e + 1) *
R``. A *pair* is one ``(token, slot)`` of the routing, ``pair = token * top_k + slot``; its
expert is ``topk_ids`` at that index. Both kernels read the expert id on the device and stream
only that expert's rows, through the GEMV's own loop (:func:`~.gemv.rows_dot`: the same
decoding, activation sums and prefetch), so a decode step reads the selected experts' blocks
and nothing else.

- :func:`moe_up_triton`: ``h[pair] = x[token] @ W13[e].T`` for every pair, grid ``(row blocks,
  pairs)``. With ``swiglu`` the stacked rows of each expert are its gate rows then its up rows
  (``R = 2I``) and a program computes ``BN`` gate rows and the ``BN`` up rows beside them, so
  it writes ``silu(gate) * up`` (float32, rounded once to x's dtype): ``[pairs, I]``. Without
  it the output is the plain product ``[pairs, R]`` (gate and up of different types run one
  launch each).
- :func:`moe_down_triton`: ``y[token] = sum_slot w[token, slot] * (h[pair] @ W2[e].T)``, grid
  ``(row blocks, tokens)``: a program walks its token's slots in order and adds the weighted
  products in float32, so the top-k sum is fused and the result does not depend on timing.

Neither kernel splits K: with one program per ``(row block, pair)`` a decode step of a MoE
layer has thousands of programs already. Neither uses PDL: the expert ids are the output of
the router, the kernel launched just before.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tallow.kernels import bit_constants, step_jit

from ..packing import PackedWeight
from .decode import plane_args, quad_range, quads_per_chunk, type_constants
from .gemv import DEFAULT_GEMV, MODE_BYTE, _load_tile, check_offsets, gemv_mode, rows_dot


@step_jit(values=["zero"], pointers=["x_ptr", "y_ptr", "ids_ptr"])
def _moe_up_kernel(
    x_ptr,
    ids_ptr,
    nib_ptr,
    pair_ptr,
    bit_ptr,
    byte_ptr,
    d_ptr,
    dm_ptr,
    sc_ptr,
    mn_ptr,
    lut_ptr,
    y_ptr,
    N,
    K,
    rows_per_expert,
    top_k,
    zero,
    s_nib,
    s_pair,
    s_bit,
    s_byte,
    s_d,
    s_sc,
    mask_lo,
    mask_hi,
    magic_lo,
    magic_hi,
    BN: tl.constexpr,
    Q: tl.constexpr,
    NIB: tl.constexpr,
    PAIR: tl.constexpr,
    BIT: tl.constexpr,
    BYTE: tl.constexpr,
    OFFSET: tl.constexpr,
    LUT: tl.constexpr,
    GROUP: tl.constexpr,
    QBLOCK: tl.constexpr,
    SCALES: tl.constexpr,
    MINS: tl.constexpr,
    MODE: tl.constexpr,
    PREFETCH: tl.constexpr,
    EVEN: tl.constexpr,
    SWIGLU: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pair = tl.program_id(1)
    expert = tl.load(ids_ptr + pair).to(tl.int32)
    # with SWIGLU the entries are 2 * BN blocks of Q: block 2j is gate row j of the program's
    # rows, block 2j + 1 the up row beside it (N rows further)
    RB: tl.constexpr = 2 * BN if SWIGLU else BN
    entry = tl.arange(0, RB * Q)
    q_in = entry % Q
    block = entry // Q
    if SWIGLU:
        local = pid_n * BN + block // 2
        rows = expert * rows_per_expert + local + (block % 2) * N
    else:
        local = pid_n * BN + block
        rows = expert * rows_per_expert + local
    row_mask = local < N
    q_begin, q_end = quad_range(0, K, K, BYTE)
    u2 = tl.arange(0, 4)[None, :]
    if PREFETCH:
        tile = _load_tile(
            nib_ptr,
            pair_ptr,
            bit_ptr,
            byte_ptr,
            d_ptr,
            dm_ptr,
            sc_ptr,
            mn_ptr,
            rows,
            row_mask,
            q_begin,
            q_in,
            q_end,
            zero,
            u2,
            s_nib,
            s_pair,
            s_bit,
            s_byte,
            s_d,
            s_sc,
            NIB,
            PAIR,
            BIT,
            BYTE,
            GROUP,
            QBLOCK,
            SCALES,
            MINS,
            EVEN,
        )
    else:
        tile = (0, 0, 0, 0, 0, 0, 0, 0, 0)
    xrow = x_ptr + (pair // top_k) * K
    acc = rows_dot(
        xrow,
        nib_ptr,
        pair_ptr,
        bit_ptr,
        byte_ptr,
        d_ptr,
        dm_ptr,
        sc_ptr,
        mn_ptr,
        lut_ptr,
        tile,
        rows,
        row_mask,
        q_in,
        q_begin,
        q_end,
        zero,
        K,
        s_nib,
        s_pair,
        s_bit,
        s_byte,
        s_d,
        s_sc,
        mask_lo,
        mask_hi,
        magic_lo,
        magic_hi,
        RB,
        Q,
        NIB,
        PAIR,
        BIT,
        BYTE,
        OFFSET,
        LUT,
        GROUP,
        QBLOCK,
        SCALES,
        MINS,
        MODE,
        PREFETCH,
        EVEN,
        -1,
    )
    y = tl.sum(tl.reshape(acc, (RB, Q)), axis=1)
    if SWIGLU:
        gate, up = tl.split(tl.reshape(y, (BN, 2)))
        y = gate / (1.0 + tl.exp(-gate)) * up
    out_rows = pid_n * BN + tl.arange(0, BN)
    tl.store(y_ptr + pair * N + out_rows, y.to(y_ptr.dtype.element_ty), mask=out_rows < N)


@step_jit(values=["zero"], pointers=["x_ptr", "y_ptr", "ids_ptr", "w_ptr"])
def _moe_down_kernel(
    x_ptr,
    ids_ptr,
    w_ptr,
    nib_ptr,
    pair_ptr,
    bit_ptr,
    byte_ptr,
    d_ptr,
    dm_ptr,
    sc_ptr,
    mn_ptr,
    lut_ptr,
    y_ptr,
    N,
    K,
    top_k,
    zero,
    s_nib,
    s_pair,
    s_bit,
    s_byte,
    s_d,
    s_sc,
    mask_lo,
    mask_hi,
    magic_lo,
    magic_hi,
    BN: tl.constexpr,
    Q: tl.constexpr,
    NIB: tl.constexpr,
    PAIR: tl.constexpr,
    BIT: tl.constexpr,
    BYTE: tl.constexpr,
    OFFSET: tl.constexpr,
    LUT: tl.constexpr,
    GROUP: tl.constexpr,
    QBLOCK: tl.constexpr,
    SCALES: tl.constexpr,
    MINS: tl.constexpr,
    MODE: tl.constexpr,
    PREFETCH: tl.constexpr,
    EVEN: tl.constexpr,
):
    pid_n = tl.program_id(0)
    token = tl.program_id(1)
    entry = tl.arange(0, BN * Q)
    q_in = entry % Q
    local = pid_n * BN + entry // Q
    row_mask = local < N
    q_begin, q_end = quad_range(0, K, K, BYTE)
    u2 = tl.arange(0, 4)[None, :]
    total = tl.zeros((BN,), dtype=tl.float32)
    for slot in range(0, top_k):
        pair = token * top_k + slot
        expert = tl.load(ids_ptr + pair).to(tl.int32)
        weight = tl.load(w_ptr + pair).to(tl.float32)
        rows = expert * N + local
        if PREFETCH:
            tile = _load_tile(
                nib_ptr,
                pair_ptr,
                bit_ptr,
                byte_ptr,
                d_ptr,
                dm_ptr,
                sc_ptr,
                mn_ptr,
                rows,
                row_mask,
                q_begin,
                q_in,
                q_end,
                zero,
                u2,
                s_nib,
                s_pair,
                s_bit,
                s_byte,
                s_d,
                s_sc,
                NIB,
                PAIR,
                BIT,
                BYTE,
                GROUP,
                QBLOCK,
                SCALES,
                MINS,
                EVEN,
            )
        else:
            tile = (0, 0, 0, 0, 0, 0, 0, 0, 0)
        acc = rows_dot(
            x_ptr + pair * K,
            nib_ptr,
            pair_ptr,
            bit_ptr,
            byte_ptr,
            d_ptr,
            dm_ptr,
            sc_ptr,
            mn_ptr,
            lut_ptr,
            tile,
            rows,
            row_mask,
            q_in,
            q_begin,
            q_end,
            zero,
            K,
            s_nib,
            s_pair,
            s_bit,
            s_byte,
            s_d,
            s_sc,
            mask_lo,
            mask_hi,
            magic_lo,
            magic_hi,
            BN,
            Q,
            NIB,
            PAIR,
            BIT,
            BYTE,
            OFFSET,
            LUT,
            GROUP,
            QBLOCK,
            SCALES,
            MINS,
            MODE,
            PREFETCH,
            EVEN,
            -1,
        )
        total += weight * tl.sum(tl.reshape(acc, (BN, Q)), axis=1)
    out_rows = pid_n * BN + tl.arange(0, BN)
    tl.store(y_ptr + token * N + out_rows, total.to(y_ptr.dtype.element_ty), mask=out_rows < N)


def _launch_args(
    p: PackedWeight, rows: int, k: int, config: tuple[int, int, int, bool] | None
) -> tuple[int, int, bool, bool, list[torch.Tensor], list[int]]:
    """(rows per program, warps, prefetch, even, plane pointers, strides) of ``p``."""
    check_offsets(p)
    bn, warps, _, prefetch = config or DEFAULT_GEMV
    n_quads = k // 32 * quads_per_chunk(p)
    q = 32 * warps
    even = rows % bn == 0 and n_quads % q == 0
    ptrs, strides = plane_args(p)
    return bn, warps, prefetch, even, ptrs, strides


def _check(x: torch.Tensor, p: PackedWeight, ids: torch.Tensor, what: str) -> None:
    if p.qtype is None:
        raise ValueError(
            f"{what}: the experts must be GGML blocks, got a dense {p.type_name} weight"
        )
    if x.dim() != 2 or x.shape[1] != p.cols:
        raise ValueError(f"{what}: x must be [rows, {p.cols}], got {tuple(x.shape)}")
    if ids.dim() != 2:
        raise ValueError(f"{what}: topk_ids must be [tokens, top_k], got {tuple(ids.shape)}")


def moe_up_triton(
    x: torch.Tensor,
    p: PackedWeight,
    num_experts: int,
    topk_ids: torch.Tensor,
    *,
    swiglu: bool,
    out: torch.Tensor | None = None,
    config: tuple[int, int, int, bool] | None = None,
) -> torch.Tensor:
    """Every pair's gate/up product (see the module docstring): ``x [T, K]``, ``p`` the
    experts' stacked ``[E * R, K]`` weight, ``topk_ids [T, top_k]``. Returns ``[T * top_k,
    R / 2]`` (``swiglu``: the activated intermediate) or ``[T * top_k, R]`` in x's dtype.
    ``config`` is the GEMV's ``(rows per program, warps, -, prefetch)``."""
    _check(x, p, topk_ids, "moe_up")
    if p.rows % num_experts:
        raise ValueError(f"moe_up: {p.rows} stacked rows are not {num_experts} experts")
    per_expert = p.rows // num_experts
    if swiglu and per_expert % 2:
        raise ValueError(f"moe_up: an expert's {per_expert} rows are not gate and up halves")
    n = per_expert // 2 if swiglu else per_expert
    tokens, top_k = topk_ids.shape
    pairs = tokens * top_k
    if out is None:
        out = torch.empty(pairs, n, dtype=x.dtype, device=x.device)
    if pairs == 0:
        return out
    x = x.contiguous()
    ids = topk_ids.contiguous()
    bn, warps, prefetch, even, ptrs, strides = _launch_args(p, n, p.cols, config)
    _moe_up_kernel[(triton.cdiv(n, bn), pairs)](
        x,
        ids,
        *ptrs,
        out,
        n,
        p.cols,
        per_expert,
        top_k,
        0,
        *strides,
        *bit_constants(gemv_mode(p) == MODE_BYTE),
        BN=bn,
        Q=32 * warps,
        **type_constants(p),
        MODE=gemv_mode(p),
        PREFETCH=prefetch,
        EVEN=even,
        SWIGLU=swiglu,
        num_warps=warps,
        num_stages=1,
    )
    return out


def moe_down_triton(
    h: torch.Tensor,
    p: PackedWeight,
    num_experts: int,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
    config: tuple[int, int, int, bool] | None = None,
) -> torch.Tensor:
    """Each token's down products over its slots, weighted and summed (see the module
    docstring): ``h [T * top_k, K]`` the pairs' intermediates, ``p`` the experts' stacked
    ``[E * H, K]`` weight, ``topk_weights``/``topk_ids [T, top_k]``. Returns ``[T, H]`` in
    ``out_dtype`` (default h's)."""
    _check(h, p, topk_ids, "moe_down")
    if p.rows % num_experts:
        raise ValueError(f"moe_down: {p.rows} stacked rows are not {num_experts} experts")
    n = p.rows // num_experts
    tokens, top_k = topk_ids.shape
    if h.shape[0] != tokens * top_k or topk_weights.shape != topk_ids.shape:
        raise ValueError(
            f"moe_down: h {tuple(h.shape)}, topk_weights "
            f"{tuple(topk_weights.shape)} and topk_ids {tuple(topk_ids.shape)} do "
            "not describe one routing"
        )
    out = torch.empty(tokens, n, dtype=out_dtype or h.dtype, device=h.device)
    if tokens == 0:
        return out
    h = h.contiguous()
    bn, warps, prefetch, even, ptrs, strides = _launch_args(p, n, p.cols, config)
    _moe_down_kernel[(triton.cdiv(n, bn), tokens)](
        h,
        topk_ids.contiguous(),
        topk_weights.contiguous(),
        *ptrs,
        out,
        n,
        p.cols,
        top_k,
        0,
        *strides,
        *bit_constants(gemv_mode(p) == MODE_BYTE),
        BN=bn,
        Q=32 * warps,
        **type_constants(p),
        MODE=gemv_mode(p),
        PREFETCH=prefetch,
        EVEN=even,
        num_warps=warps,
        num_stages=1,
    )
    return out
