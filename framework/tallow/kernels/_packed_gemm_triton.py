"""The Triton kernels of :mod:`tallow.kernels.packed_gemm`: a GEMM whose second operand is
decoded from the packed layout in registers, tile by tile, into ``tl.dot``'s operand (tensor
cores: ``mma``/``wgmma``), and the same decoding written out as float32 (the tests' check of its
bits).

Decoding a ``BLOCK_K x BLOCK_N`` tile: 4-bit words are loaded as ``[BLOCK_K / 8, BLOCK_N]`` and
each shifted by ``0, 4, ..., 28`` into a ``[BLOCK_K / 8, 8, BLOCK_N]`` block, which is the tile
in K order (the layout puts row ``k``'s code in bits ``4 (k % 8)``). An integer code becomes its
float by OR-ing it into the mantissa of ``2**23`` and subtracting ``2**23`` together with the
zero point (one integer and one float operation, exact). The tile is then seen as
``[BLOCK_K / SUB, SUB, BLOCK_N]``, ``SUB`` rows per scale group (or the whole tile inside one
group), so each group's scale, zero and min is loaded once per column and broadcast.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._dispatch import interpreting
from .packed_layout import PackedGemmConfig, PackedGemmWeight, check_config, packed_gemm_config

_KIND_IDS = {"u4": 0, "u8": 1, "fp8": 2, "e2m1": 3}
#: 2**23: its float32 mantissa holds an integer code exactly
_MAGIC = 8388608.0


@triton.jit
def _e2m1_value(q):
    """FP4 e2m1 codes (int32, 0..15) → their float32 values. The code's exponent and mantissa
    bits shifted to the top of float32's mantissa field, ``(q & 7) << 22``, are the float
    ``2**(e - 127) * (1 + m/2)`` (``m/2 * 2**-126``, a subnormal, for ``e = 0``): the value
    times ``2**-126``, which one exact product takes back; bit 3 becomes the sign bit."""
    bits = ((q & 7) << 22) | ((q & 8) << 28)
    return bits.to(tl.float32, bitcast=True) * 8.507059173023462e37  # 2**126


@triton.jit
def _decode_tile(
    codes_ptr,
    scales_ptr,
    zeros_ptr,
    mins_ptr,
    k0,
    offs_n,
    N,
    K,
    scale_stride,
    zero_point,
    KIND: tl.constexpr,
    GROUP: tl.constexpr,
    SUB: tl.constexpr,
    SCALE_COLS: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
    HAS_MINS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The weights ``[k0, k0 + BLOCK_K) x offs_n`` as float32 ``[BLOCK_K, BLOCK_N]`` (rows past
    K and columns past N decode to zero)."""
    mask_n = offs_n < N
    if KIND == 0 or KIND == 3:
        offs_w = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        words = tl.load(
            codes_ptr + offs_w[:, None] * N + offs_n[None, :],
            mask=(offs_w[:, None] < K // 8) & mask_n[None, :],
            other=0,
        )
        shifts = tl.arange(0, 8) * 4
        q = (words[:, None, :] >> shifts[None, :, None]) & 15
        q = tl.reshape(q, (BLOCK_K, BLOCK_N), can_reorder=False)
        if KIND == 0:
            raw = (q | 0x4B000000).to(tl.float32, bitcast=True)
            bias = 8388608.0
        else:
            raw = _e2m1_value(q)
            bias = 0.0
    else:
        offs_k = k0 + tl.arange(0, BLOCK_K)
        kmask = (offs_k[:, None] < K) & mask_n[None, :]
        if KIND == 1:
            c = tl.load(codes_ptr + offs_k[:, None] * N + offs_n[None, :], mask=kmask, other=0)
            raw = (c.to(tl.int32) | 0x4B000000).to(tl.float32, bitcast=True)
            bias = 8388608.0
        else:
            c = tl.load(codes_ptr + offs_k[:, None] * N + offs_n[None, :], mask=kmask, other=0.0)
            raw = c.to(tl.float32)
            bias = 0.0
    NSUB: tl.constexpr = BLOCK_K // SUB
    starts = k0 + tl.arange(0, NSUB) * SUB
    groups = starts // GROUP
    gmask = (starts < K)[:, None] & mask_n[None, :]
    s = tl.load(
        scales_ptr + groups[:, None] * scale_stride + (offs_n // SCALE_COLS)[None, :],
        mask=gmask,
        other=0.0,
    ).to(tl.float32)
    raw3 = tl.reshape(raw, (NSUB, SUB, BLOCK_N), can_reorder=False)
    if HAS_ZEROS:
        z = tl.load(zeros_ptr + groups[:, None] * N + offs_n[None, :], mask=gmask, other=0).to(
            tl.float32
        )
        v = (raw3 - (bias + z)[:, None, :]) * s[:, None, :]
    else:
        v = (raw3 - (bias + zero_point)) * s[:, None, :]
    if HAS_MINS:
        mn = tl.load(mins_ptr + groups[:, None] * N + offs_n[None, :], mask=gmask, other=0.0).to(
            tl.float32
        )
        v = v - mn[:, None, :]
    return tl.reshape(v, (BLOCK_K, BLOCK_N), can_reorder=False)


@triton.jit
def _packed_gemm_kernel(
    x_ptr,
    codes_ptr,
    scales_ptr,
    zeros_ptr,
    mins_ptr,
    bias_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    scale_stride,
    zero_point,
    tiles_per_split,
    KIND: tl.constexpr,
    GROUP: tl.constexpr,
    SUB: tl.constexpr,
    SCALE_COLS: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
    HAS_MINS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    PARTIAL: tl.constexpr,
    UPCAST: tl.constexpr,
    SWAP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """One ``BLOCK_M x BLOCK_N`` output tile over ``tiles_per_split`` K blocks (the ones of
    split ``program_id(1)``). ``PARTIAL``: float32 partial sums into ``y [splits, M, N]``;
    else the tile (plus bias) in y's dtype. ``SWAP``: the transposed product, the decoded
    weights as ``tl.dot``'s first operand (see :class:`PackedGemmConfig`). ``UPCAST``: both
    operands (the weights already rounded to x's dtype) multiplied as float32, the same
    products: Triton's interpreter multiplies bfloat16 tiles wrongly."""
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    tiles_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // tiles_n
    pid_n = pid % tiles_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    if SWAP:
        acc_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in range(0, tiles_per_split):
        k0 = (pid_k * tiles_per_split + t) * BLOCK_K
        offs_k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
            mask=mask_m[:, None] & (offs_k < K)[None, :],
            other=0.0,
        )
        b = _decode_tile(
            codes_ptr,
            scales_ptr,
            zeros_ptr,
            mins_ptr,
            k0,
            offs_n,
            N,
            K,
            scale_stride,
            zero_point,
            KIND,
            GROUP,
            SUB,
            SCALE_COLS,
            HAS_ZEROS,
            HAS_MINS,
            BLOCK_K,
            BLOCK_N,
        )
        b = b.to(a.dtype)
        if SWAP:
            acc_t = tl.dot(tl.trans(b), tl.trans(a), acc_t)
        elif UPCAST:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    if SWAP:
        acc = tl.trans(acc_t)
    mask = mask_m[:, None] & (offs_n < N)[None, :]
    if PARTIAL:
        out = y_ptr + pid_k * M * N + offs_m[:, None] * N + offs_n[None, :]
        tl.store(out, acc, mask=mask)
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(
            y_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(y_ptr.dtype.element_ty), mask=mask
        )


@triton.jit
def _dequantize_kernel(
    codes_ptr,
    scales_ptr,
    zeros_ptr,
    mins_ptr,
    out_ptr,
    N,
    K,
    scale_stride,
    zero_point,
    KIND: tl.constexpr,
    GROUP: tl.constexpr,
    SUB: tl.constexpr,
    SCALE_COLS: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
    HAS_MINS: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """The decoded tile of program ``(k block, n block)`` into ``out [N, K]`` (float32)."""
    k0 = tl.program_id(0) * BLOCK_K
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = k0 + tl.arange(0, BLOCK_K)
    v = _decode_tile(
        codes_ptr,
        scales_ptr,
        zeros_ptr,
        mins_ptr,
        k0,
        offs_n,
        N,
        K,
        scale_stride,
        zero_point,
        KIND,
        GROUP,
        SUB,
        SCALE_COLS,
        HAS_ZEROS,
        HAS_MINS,
        BLOCK_K,
        BLOCK_N,
    )
    tl.store(
        out_ptr + offs_n[None, :] * K + offs_k[:, None],
        v,
        mask=(offs_k < K)[:, None] & (offs_n < N)[None, :],
    )


def _weight_args(w: PackedGemmWeight, block_k: int) -> tuple[list, dict]:
    """The weight's pointer and scalar arguments and its constexprs, for K blocks of
    ``block_k``."""
    # a group narrower than the tile splits it (and divides it); one as wide as K never does
    sub = w.group if w.group < min(block_k, w.cols) else block_k
    dummy = w.scales
    args = [
        w.codes,
        w.scales,
        w.zeros if w.zeros is not None else dummy,
        w.mins if w.mins is not None else dummy,
    ]
    constexprs = dict(
        KIND=_KIND_IDS[w.kind],
        GROUP=w.group,
        SUB=sub,
        SCALE_COLS=w.scale_cols,
        HAS_ZEROS=w.zeros is not None,
        HAS_MINS=w.mins is not None,
    )
    return args, constexprs


def packed_gemm_triton(
    x: torch.Tensor,
    w: PackedGemmWeight,
    bias: torch.Tensor | None = None,
    *,
    config: PackedGemmConfig | None = None,
) -> torch.Tensor:
    """``x [M, K] @ W^T (+ bias)`` → ``[M, N]`` in x's dtype (float16 or bfloat16)."""
    if x.dim() != 2 or x.shape[1] != w.cols:
        raise ValueError(f"packed GEMM: x must be [M, {w.cols}], got {tuple(x.shape)}")
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"packed GEMM: x must be float16 or bfloat16, got {x.dtype}")
    if bias is not None and tuple(bias.shape) != (w.rows,):
        raise ValueError(f"packed GEMM: bias must be [{w.rows}], got {tuple(bias.shape)}")
    m, k = x.shape
    n = w.rows
    cfg = config or packed_gemm_config(m, n, k, w.kind)
    check_config(w, cfg)
    x = x if x.stride(1) == 1 else x.contiguous()
    k_tiles = triton.cdiv(k, cfg.block_k)
    per_split = triton.cdiv(k_tiles, min(cfg.split_k, k_tiles))
    splits = triton.cdiv(k_tiles, per_split)
    partial = splits > 1
    if partial:
        y = torch.empty(splits, m, n, dtype=torch.float32, device=x.device)
    else:
        y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return torch.empty(0, n, dtype=x.dtype, device=x.device)
    args, constexprs = _weight_args(w, cfg.block_k)
    upcast = interpreting() and x.dtype == torch.bfloat16
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), splits)
    _packed_gemm_kernel[grid](
        x,
        *args,
        bias if bias is not None else x,
        y,
        m,
        n,
        k,
        x.stride(0),
        w.scales.stride(0),
        w.zero_point,
        per_split,
        **constexprs,
        HAS_BIAS=bias is not None and not partial,
        PARTIAL=partial,
        UPCAST=upcast,
        SWAP=cfg.swap_ab and not upcast,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=cfg.block_k,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if not partial:
        return y
    out = y.sum(0)
    if bias is not None:
        out += bias.to(torch.float32)
    return out.to(x.dtype)


def dequantize_packed_triton(
    w: PackedGemmWeight, block_k: int = 64, block_n: int = 32
) -> torch.Tensor:
    """The weight decoded by the GEMM's own tile decoding, float32 ``[N, K]``.

    Each product and difference is rounded on its own (no fused multiply-add), as the torch
    reference and the formats' own dequantizers compute it: a Q4_K-style ``d * q - m`` fused
    into one FMA rounds once, one float32 ulp away at times. Inside the GEMM the compiler may
    fuse it; that difference is far below the GEMM's 16-bit rounding."""
    check_config(w, PackedGemmConfig(16, block_n, block_k))
    out = torch.empty(w.rows, w.cols, dtype=torch.float32, device=w.device)
    args, constexprs = _weight_args(w, block_k)
    grid = (triton.cdiv(w.cols, block_k), triton.cdiv(w.rows, block_n))
    _dequantize_kernel[grid](
        *args,
        out,
        w.rows,
        w.cols,
        w.scales.stride(0),
        w.zero_point,
        **constexprs,
        BLOCK_K=block_k,
        BLOCK_N=block_n,
        enable_fp_fusion=False,
    )
    return out
