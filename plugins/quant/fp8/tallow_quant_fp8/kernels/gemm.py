"""The tensor-core matmul of larger batches where ``torch._scaled_mm`` does not serve a layer
(a shape cuBLAS refuses, block-wise scales on a torch without them, weights-only
checkpoints): ``y = (a * sa) @ (q * sw).T (+ b)``, accumulated in float32.

``A_SCALES`` says what ``a`` is: 0, activations as they are (bf16/fp16/float32: the weight
tile is widened to their dtype in the kernel, the "dequantize in the kernel" GEMM of
weights-only checkpoints); 1, e4m3 with one scale per row (per token); 2, e4m3 with one scale
per row and 128 columns (block-wise weights). e4m3 times e4m3 runs on the float8 tensor cores
(compute capability 8.9+). Weight scales are per output row, or per 128 x 128 block. Scales
that vary along K (per 128 columns) multiply each 128-column partial product; the others
multiply the sum once. Programs walk the output tiles in groups of ``GROUP_M`` row tiles, so
neighbours share weight tiles in L2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tallow.kernels import step_jit

from ..weights import BLOCK, Fp8Weight

#: e4m3 activations, per row / per row and 128 columns
A_FLOAT, A_ROW, A_GROUP = 0, 1, 2


@step_jit(values=("M",))
def _gemm_kernel(
    a_ptr,
    sa_ptr,
    w_ptr,
    sw_ptr,
    b_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_am,
    stride_sam,
    stride_sag,
    stride_wn,
    stride_swn,
    stride_ym,
    A_SCALES: tl.constexpr,
    BLOCKWISE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    in_group = GROUP_M * num_n
    first_m = (pid // in_group) * GROUP_M
    size_m = tl.minimum(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % in_group) % size_m
    pid_n = (pid % in_group) // size_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    # block scales: this tile's columns lie in one 128-row block of the weight
    sw_row = sw_ptr + ((pid_n * BLOCK_N) // 128) * stride_swn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=m_mask[:, None], other=0.0)
            w = tl.load(w_ptrs, mask=n_mask[:, None], other=0.0)
        else:
            k_mask = (k + offs_k) < K
            a = tl.load(a_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
        if A_SCALES == 0:
            w = w.to(a.dtype)
        part = tl.dot(a, tl.trans(w), input_precision=DOT_PRECISION)
        if BLOCKWISE or A_SCALES == 2:  # BLOCK_K == 128: one group of columns
            if A_SCALES == 2:
                sa = tl.load(
                    sa_ptr + offs_m * stride_sam + (k // 128) * stride_sag, mask=m_mask, other=0.0
                )
                part = part * sa[:, None]
            if BLOCKWISE:
                part = part * tl.load(sw_row + k // 128)
        acc += part
        a_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if A_SCALES == 1:
        acc = acc * tl.load(sa_ptr + offs_m * stride_sam, mask=m_mask, other=0.0)[:, None]
    if not BLOCKWISE:
        acc = acc * tl.load(sw_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def gemm_config(m: int, a_fp8: bool, k_steps_of_128: bool) -> tuple[int, int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages). K advances 128 columns at a time
    when a scale changes every 128 columns, and for e4m3 operands (128 bytes per row)."""
    block_k = BLOCK if (a_fp8 or k_steps_of_128) else 64
    if m <= 64:
        return 64, 128, block_k, 4, 3
    return 128, 128, block_k, 8, 3


def gemm_triton(
    a: torch.Tensor,
    weight: Fp8Weight,
    bias: torch.Tensor | None = None,
    *,
    a_scales: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    config: tuple[int, int, int, int, int] | None = None,
) -> torch.Tensor:
    """``a [M, K]`` times the weight → ``[M, N]`` of ``out_dtype`` (default a's dtype). ``a``
    is e4m3 with ``a_scales`` (float32 ``[M, 1]`` or ``[M, K / 128]``, any strides), or float
    activations without."""
    m, k = a.shape
    n = weight.rows
    if a.stride(1) != 1:
        a = a.contiguous()
    if a_scales is None:
        mode = A_FLOAT
        out_dtype = out_dtype or a.dtype
    else:
        mode = A_ROW if a_scales.shape[1] == 1 else A_GROUP
        if out_dtype is None:
            raise ValueError("fp8 GEMM: e4m3 activations need an out_dtype")
    if (weight.block or mode == A_GROUP) and k % BLOCK:
        raise ValueError(
            f"fp8 GEMM: scales per {BLOCK} columns need K a multiple of {BLOCK}, got {k}"
        )
    block_m, block_n, block_k, warps, stages = config or gemm_config(
        m, mode != A_FLOAT, weight.block or mode == A_GROUP
    )
    if weight.block and BLOCK % block_n:
        raise ValueError(
            f"fp8 GEMM: block-wise weights need BLOCK_N dividing {BLOCK}, got {block_n}"
        )
    y = torch.empty(m, n, dtype=out_dtype, device=a.device)
    if m == 0:
        return y
    sa = a_scales if a_scales is not None else weight.scale
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n),)
    _gemm_kernel[grid](
        a,
        sa,
        weight.data,
        weight.scale,
        bias if bias is not None else weight.scale,
        y,
        m,
        n,
        k,
        a.stride(0),
        sa.stride(0),
        sa.stride(1) if sa.dim() == 2 else 0,
        weight.data.stride(0),
        weight.scale.stride(0),
        y.stride(0),
        A_SCALES=mode,
        BLOCKWISE=weight.block,
        HAS_BIAS=bias is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        GROUP_M=8,
        EVEN_K=k % block_k == 0,
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        num_warps=warps,
        num_stages=stages,
    )
    return y
