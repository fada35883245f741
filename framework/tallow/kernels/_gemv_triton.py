"""Triton matrix-vector products for decode: ``y = x @ (W * s).T (+ b)`` for a handful of rows.

At batch 1 a decode step is a chain of weight reads, and the speed of the whole model is the
speed at which these kernels stream ``W`` from HBM. Each program owns ``BLOCK_N`` output
features and walks the whole ``K`` dimension, so every weight byte is read exactly once and
no cross-program reduction is needed.

``W`` is float (bf16/fp16/float32, the activations' dtype) or float8 e4m3 with float32 scales:
one per output row (``scale [N]``, applied to the row's sum) or one per 128 x 128 block
(``scale [ceil(N/128), ceil(K/128)]``, applied to each 128-column part of the sum). One kernel
serves every weight type; the weights are widened in registers and everything accumulates in
float32.

One row (``BLOCK_M == 1``): the weight tile is ``[BLOCK_N, BLOCK_K / VEC, VEC]``, VEC the
elements of a 16-byte load (8 bf16, 16 e4m3), so every thread reads whole 16-byte vectors and
sums each vector's products in its own registers before adding them to one float32
accumulator per vector slot. The accumulators are thus ``VEC`` times fewer than the weights a
thread has in flight: registers stay low (56 for bf16, 72 for e4m3 at the default tiles, sm_90),
many programs fit on an SM, and each keeps 16 KB of weights in flight per step. The
bandwidth of a GEMV is the bytes in flight per SM over the memory latency, and e4m3 needs twice
the elements per thread of bf16 for the same bytes, hence the vector sums.

A few rows (2–16) pad to 16 and use ``tl.dot`` with the weight tile widened to the
activations' dtype (exact: every e4m3 value is a bf16 and an fp16 value): the tensor cores are
idle anyway, and the weight tile is loaded once for all rows. Block scales make K advance 128
columns at a time there, each partial product scaled.

Launched with Programmatic Dependent Launch (:mod:`tallow.kernels.pdl`), a one-row program
issues its first weight tile before waiting for the kernel that produced ``x``: the weight
stream starts while that kernel's last wave still runs. ``W`` and its scales must therefore be
memory no kernel of the step writes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._activation_triton import KINDS, gated_value
from .jit import step_jit
from .pdl import allow_next, pdl_enabled, wait_prior

#: rows and columns of a block of block-wise scales
SCALE_BLOCK = 128
#: scale layouts (the kernel's SCALES): none, one per output row, one per 128 x 128 block
NO_SCALE, ROW_SCALES, BLOCK_SCALES = 0, 1, 2
#: the most rows the kernel takes
MAX_ROWS = 16


@triton.jit
def _load_w(w_ptrs, k, cols, n_mask, K, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr):
    """The weight tile whose first column is ``k`` (zeros past N and K); ``cols`` are the
    tile's column offsets, shaped like its trailing dimensions."""
    if EVEN_K:
        if EVEN_N:
            w = tl.load(w_ptrs)
        else:
            w = tl.load(w_ptrs, mask=n_mask, other=0.0)
    else:
        w = tl.load(w_ptrs, mask=n_mask & ((k + cols) < K)[None], other=0.0)
    return w


@triton.jit
def _load_x(x_ptrs, mask, K, GATE: tl.constexpr):
    """Activations at ``x_ptrs`` (``mask`` None: all of them). With a gate (``GATE`` >= 0, a
    kind of :data:`_activation_triton.KINDS`) each row of x is ``[gate | up]``, K wide each,
    and the value is ``act(gate) * up`` as the activation kernel rounds it."""
    if mask is None:
        x = tl.load(x_ptrs)
    else:
        x = tl.load(x_ptrs, mask=mask, other=0.0)
    if GATE >= 0:
        if mask is None:
            up = tl.load(x_ptrs + K)
        else:
            up = tl.load(x_ptrs + K, mask=mask, other=0.0)
        x = gated_value(x, up, GATE, x_ptrs.dtype.element_ty)
    return x


@triton.jit
def _row_step(
    w,
    x_ptrs,
    s_row,
    k,
    cols,
    groups,
    K,
    EVEN_K: tl.constexpr,
    SCALES: tl.constexpr,
    GATE: tl.constexpr,
    VEC: tl.constexpr,
):
    """One K step of the one-row product: ``[BLOCK_N, G]`` sums of each 16-byte vector's
    products (times its 128 x 128 block's scale with block scales)."""
    if EVEN_K:
        x = _load_x(x_ptrs, None, K, GATE)
    else:
        x = _load_x(x_ptrs, (k + cols) < K, K, GATE)
    part = tl.sum(w.to(tl.float32) * x.to(tl.float32)[None], axis=2)
    if SCALES == 2:
        col = k + groups * VEC
        if EVEN_K:
            s = tl.load(s_row + col // 128)
        else:
            s = tl.load(s_row + col // 128, mask=col < K, other=0.0)
        part = part * s[None, :]
    return part


@step_jit(values=("M",))
def _gemv_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    b_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_ym,
    HAS_BIAS: tl.constexpr,
    SCALES: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    VEC: tl.constexpr,
    EVEN_K: tl.constexpr,
    EVEN_N: tl.constexpr,
    GATE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    # block scales: this program's rows lie in one 128-row block (BLOCK_N divides 128)
    s_row = s_ptr + ((pid * BLOCK_N) // 128) * stride_sn
    if BLOCK_M == 1:
        G: tl.constexpr = BLOCK_K // VEC
        groups = tl.arange(0, G)
        cols = groups[:, None] * VEC + tl.arange(0, VEC)[None, :]  # [G, VEC]
        w_ptrs = w_ptr + offs_n[:, None, None].to(tl.int64) * stride_wn + cols[None]
        n_mask3 = n_mask[:, None, None]
        x_ptrs = x_ptr + cols
        # The weights are no kernel's output: stream the first tile while the previous kernel
        # finishes (see pdl.py), then wait for x and run the first K step outside the loop.
        w = _load_w(w_ptrs, 0, cols, n_mask3, K, EVEN_K, EVEN_N)
        wait_prior(USE_PDL)
        allow_next(USE_PDL)
        acc = _row_step(w, x_ptrs, s_row, 0, cols, groups, K, EVEN_K, SCALES, GATE, VEC)
        for k in range(BLOCK_K, K, BLOCK_K):
            w_ptrs += BLOCK_K
            x_ptrs += BLOCK_K
            w = _load_w(w_ptrs, k, cols, n_mask3, K, EVEN_K, EVEN_N)
            acc += _row_step(w, x_ptrs, s_row, k, cols, groups, K, EVEN_K, SCALES, GATE, VEC)
        y = tl.sum(acc, axis=1)[None, :]
        offs_m = tl.arange(0, 1)
        m_mask = offs_m < 1
    else:
        # several rows: tl.dot behind the wait
        offs_k = tl.arange(0, BLOCK_K)
        offs_m = tl.arange(0, BLOCK_M)
        m_mask = offs_m < M
        w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
        x_ty = x_ptr.dtype.element_ty
        wait_prior(USE_PDL)
        allow_next(USE_PDL)
        y = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            if EVEN_K:
                x_mask = m_mask[:, None]
            else:
                x_mask = m_mask[:, None] & ((k + offs_k) < K)[None, :]
            x = _load_x(x_ptrs, x_mask, K, GATE)
            w = _load_w(w_ptrs, k, offs_k, n_mask[:, None], K, EVEN_K, EVEN_N).to(x_ty)
            part = tl.dot(x, tl.trans(w), input_precision=DOT_PRECISION)
            if SCALES == 2:  # BLOCK_K == 128: one block of columns
                part = part * tl.load(s_row + k // 128)
            y += part
            w_ptrs += BLOCK_K
            x_ptrs += BLOCK_K
    if SCALES == 1:
        y = y * tl.load(s_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def vector_width(weight_dtype: torch.dtype) -> int:
    """Elements of ``weight_dtype`` in one 16-byte load (the one-row tile's VEC)."""
    return 16 // weight_dtype.itemsize


def gemv_config(
    m: int, n: int, k: int, weight_dtype: torch.dtype = torch.bfloat16, block_scales: bool = False
) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps) for an ``m x k`` by ``k x n`` product.

    One row, 16-bit weights with K >= 2,048: two output features per program, 2,048 columns
    per step, eight warps — the fastest tile of the sweep on every llama-3-8b shape (the GEMV
    sweep of ``bench/gpu/profile_decode.py gemv``, docs/benchmarks.md): many small programs
    keep more loads in flight than a few wide ones, and eight warps per program cover the
    latency of each 8 KB step. One row, e4m3 weights with K >= 2,048: four output rows per
    program on eight warps, the same 8 KB per step (end to end on llama-3-8b it decoded
    faster than eight rows on four warps, docs/benchmarks.md).

    Several rows: 32 output features, up to 256 columns per step (128 with block scales: one
    block of columns per step).
    """
    vec = vector_width(weight_dtype)
    if m == 1:
        if k >= 2048:
            return (1, 4, 2048, 8) if weight_dtype.itemsize == 1 else (1, 2, 2048, 8)
        block_n = 8 if weight_dtype.itemsize == 1 else 4
        block_k = max(vec, min(1024, triton.next_power_of_2(k)))
        if weight_dtype.itemsize != 1:
            return 1, block_n, block_k, 2
        return 1, block_n, block_k, max(1, min(4, block_k // vec // 32))
    if block_scales:
        return MAX_ROWS, 32, SCALE_BLOCK, 4
    return MAX_ROWS, 32, min(256, max(16, triton.next_power_of_2(k))), 4


def _scale_layout(scale: torch.Tensor | None, n: int, k: int) -> int:
    if scale is None:
        return NO_SCALE
    if scale.dtype != torch.float32:
        raise ValueError(f"gemv: scales must be float32, got {scale.dtype}")
    if scale.dim() == 1 and scale.shape[0] == n:
        return ROW_SCALES
    blocks = (-(-n // SCALE_BLOCK), -(-k // SCALE_BLOCK))
    if scale.dim() == 2 and tuple(scale.shape) == blocks and scale.stride(1) == 1:
        return BLOCK_SCALES
    raise ValueError(
        f"gemv: scale must be [{n}] (one per output row) or {list(blocks)} (one "
        f"per {SCALE_BLOCK} x {SCALE_BLOCK} block, contiguous rows) for a "
        f"[{n}, {k}] weight, got {list(scale.shape)}"
    )


def gemv_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    scale: torch.Tensor | None = None,
    config: tuple[int, int, int, int] | None = None,
    gate: str | None = None,
) -> torch.Tensor:
    """``x [M, K] @ (weight [N, K] * scale).T (+ bias [N])`` → [M, N] in x's dtype, M ≤ 16.

    ``weight`` is in x's dtype (no ``scale``) or float8 e4m3 with float32 ``scale``: ``[N]``,
    one per output row, or ``[ceil(N/128), ceil(K/128)]``, one per 128 x 128 block.
    ``config`` overrides :func:`gemv_config` (benchmarks sweep it). With ``gate`` ("silu" or
    "gelu_tanh") x is ``[M, 2K]``, ``[gate | up]`` per row, and the product is
    ``(act(gate) * up) @ W.T``, the activation computed as the kernel reads x."""
    m = x.shape[0]
    n, k = weight.shape
    if m > MAX_ROWS:
        raise ValueError(f"gemv: at most {MAX_ROWS} rows, got {m}")
    if weight.stride(1) != 1:
        raise ValueError("gemv: the weight's rows must be contiguous")
    if x.stride(-1) != 1:
        x = x.contiguous()
    scales = _scale_layout(scale, n, k)
    block_m, block_n, block_k, warps = config or gemv_config(
        m, n, k, weight.dtype, scales == BLOCK_SCALES
    )
    if scales == BLOCK_SCALES and (
        SCALE_BLOCK % block_n or (block_m > 1 and block_k != SCALE_BLOCK)
    ):
        raise ValueError(
            f"gemv config {(block_m, block_n, block_k, warps)}: block scales need "
            f"BLOCK_N dividing {SCALE_BLOCK} (and BLOCK_K = {SCALE_BLOCK} for "
            "several rows)"
        )
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    use_pdl = pdl_enabled(x)
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x,
        weight,
        scale if scale is not None else weight,
        bias if bias is not None else weight,
        y,
        m,
        n,
        k,
        x.stride(0),
        weight.stride(0),
        scale.stride(0) if scale is not None else 0,
        y.stride(0),
        HAS_BIAS=bias is not None,
        SCALES=scales,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        VEC=min(vector_width(weight.dtype), block_k),
        # EVEN_K reads the first tile unmasked: K = 0 takes the masked path
        EVEN_K=k > 0 and k % block_k == 0,
        EVEN_N=n % block_n == 0,
        GATE=-1 if gate is None else KINDS[gate],
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        USE_PDL=use_pdl,
        num_warps=warps,
        launch_pdl=use_pdl,
    )
    return y
