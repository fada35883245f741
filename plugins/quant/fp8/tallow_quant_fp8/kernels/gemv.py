"""Weight-only products for decode batches: ``y = x @ (q * s).T (+ b)`` for up to 16 rows of
bf16/fp16 (or float32) activations, the weights read once as e4m3.

At batch 1 a decode step is a chain of weight reads; an e4m3 weight is half the bytes of a
bf16 one, so these kernels are what makes FP8 decoding fast. Each program owns ``BLOCK_N``
output rows and walks all of K (no cross-program reduction):

- one row (``BLOCK_M == 1``): the ``[BLOCK_N, BLOCK_K]`` weight tile is widened to float32 and
  multiplied elementwise with the activations, accumulated in float32 and reduced across K
  once at the end. Per-row scales multiply the sums; block scales (one per 128 x 128 block: a
  program's rows lie in one 128-row block) multiply the activations of each 128 columns as they
  are loaded. With Programmatic Dependent Launch the first weight tile is requested before the
  kernel waits for the one that wrote x (:mod:`tallow.kernels.pdl`);
- 2–16 rows (``BLOCK_M == 16``): ``tl.dot`` of the activations with the weight tile widened
  to the activations' dtype (exact: every e4m3 value is a bf16 and an fp16 value), in float32;
  with block scales K advances 128 columns at a time and each partial product is scaled.

``GATE``: x is ``[gate | up]`` and the product is ``(act(gate) * up) @ W.T``, the activation
computed as the kernel reads x, as the activation kernel rounds it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tallow.kernels.activation_triton import KINDS, gated_value
from tallow.kernels.jit import step_jit
from tallow.kernels.pdl import allow_next, pdl_enabled, wait_prior

from ..weights import BLOCK, Fp8Weight
from .common import pow2_divisor

#: the most rows these kernels take
MAX_ROWS = 16


@triton.jit
def _load_x(x_ptrs, mask, K, GATE: tl.constexpr, X_TY: tl.constexpr):
    """Activations at ``x_ptrs`` (``mask`` None: all of them); with a gate, the row is
    ``[gate | up]`` and the value ``act(gate) * up`` as the activation kernel rounds it."""
    if mask is None:
        x = tl.load(x_ptrs)
    else:
        x = tl.load(x_ptrs, mask=mask, other=0.0)
    if GATE >= 0:
        if mask is None:
            up = tl.load(x_ptrs + K)
        else:
            up = tl.load(x_ptrs + K, mask=mask, other=0.0)
        x = gated_value(x, up, GATE, X_TY)
    return x


@triton.jit
def _load_w(w_ptrs, k, offs_k, n_mask, K, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr):
    if EVEN_K:
        if EVEN_N:
            w = tl.load(w_ptrs)
        else:
            w = tl.load(w_ptrs, mask=n_mask[:, None], other=0.0)
    else:
        w = tl.load(w_ptrs, mask=n_mask[:, None] & ((k + offs_k) < K)[None, :], other=0.0)
    return w


@triton.jit
def _row_x(x_row, s_row, k, offs_k, K, EVEN_K: tl.constexpr, BLOCK_K: tl.constexpr,
           BLOCKWISE: tl.constexpr, GATE: tl.constexpr, X_TY: tl.constexpr):
    """The one row's activations of columns ``k + offs_k`` in float32 (a 1-d tile: the weight
    tile's rows broadcast it without moving values between lanes), times their block's weight
    scale when the weight is block-wise (one scale per 128 columns, applied to the tile
    reshaped as ``[BLOCK_K / 128, 128]``)."""
    if EVEN_K:
        x = _load_x(x_row, None, K, GATE, X_TY).to(tl.float32)
    else:
        x = _load_x(x_row, (k + offs_k) < K, K, GATE, X_TY).to(tl.float32)
    if BLOCKWISE:
        G: tl.constexpr = BLOCK_K // 128
        groups = k // 128 + tl.arange(0, G)
        if EVEN_K:
            s = tl.load(s_row + groups)
        else:
            s = tl.load(s_row + groups, mask=groups * 128 < K, other=0.0)
        x = tl.reshape(tl.reshape(x, (G, 128)) * s[:, None], (BLOCK_K,))
    return x


@step_jit(values=("M",))
def _gemv_kernel(x_ptr, w_ptr, s_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_sn,
                 stride_ym, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr,
                 EVEN_N: tl.constexpr, BLOCKWISE: tl.constexpr, GATE: tl.constexpr,
                 DOT_PRECISION: tl.constexpr, USE_PDL: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    offs_m = tl.arange(0, BLOCK_M)
    n_mask = offs_n < N
    m_mask = offs_m < M
    x_ty = x_ptr.dtype.element_ty
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
    # block scales: this program's rows lie in one 128-row block (BLOCK_N divides 128)
    s_row = s_ptr + ((pid * BLOCK_N) // 128) * stride_sn
    if BLOCK_M == 1:
        x_row = x_ptr + offs_k
        # the weights are no kernel's output: the first tile is requested before the wait
        w = _load_w(w_ptrs, 0, offs_k, n_mask, K, EVEN_K, EVEN_N)
        wait_prior(USE_PDL)
        allow_next(USE_PDL)
        x = _row_x(x_row, s_row, 0, offs_k, K, EVEN_K, BLOCK_K, BLOCKWISE, GATE, x_ty)
        acc = w.to(tl.float32) * x[None, :]
        for k in range(BLOCK_K, K, BLOCK_K):
            w_ptrs += BLOCK_K
            x_row += BLOCK_K
            w = _load_w(w_ptrs, k, offs_k, n_mask, K, EVEN_K, EVEN_N)
            x = _row_x(x_row, s_row, k, offs_k, K, EVEN_K, BLOCK_K, BLOCKWISE, GATE, x_ty)
            acc += w.to(tl.float32) * x[None, :]
        y = tl.sum(acc, axis=1)[None, :]
    else:
        wait_prior(USE_PDL)
        allow_next(USE_PDL)
        y = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            if EVEN_K:
                x_mask = m_mask[:, None]
            else:
                x_mask = m_mask[:, None] & ((k + offs_k) < K)[None, :]
            x = _load_x(x_ptrs, x_mask, K, GATE, x_ty)
            w = _load_w(w_ptrs, k, offs_k, n_mask, K, EVEN_K, EVEN_N).to(x_ty)
            part = tl.dot(x, tl.trans(w), input_precision=DOT_PRECISION)
            if BLOCKWISE:  # BLOCK_K == 128: one block of columns
                part = part * tl.load(s_row + k // 128)
            y += part
            w_ptrs += BLOCK_K
            x_ptrs += BLOCK_K
    if not BLOCKWISE:
        y = y * tl.load(s_ptr + offs_n, mask=n_mask, other=0.0)[None, :]
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def gemv_config(m: int, n: int, k: int, blockwise: bool) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps) for ``m`` rows through an ``[n, k]`` weight.

    One row: four output rows per program and 2048 columns per step (8 KiB of weights in
    flight per program, 64 float32 accumulators a thread), as many small programs keep more
    loads in flight than a few wide ones. Several rows: 32 output rows, 128 columns per step
    (one block of block scales)."""
    if m == 1:
        return 1, 4, pow2_divisor(k, 2048) if k >= 16 else 16, 4
    return MAX_ROWS, 32, BLOCK if blockwise else pow2_divisor(k, 256), 4


def gemv_triton(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None = None, *,
                gate: str | None = None,
                config: tuple[int, int, int, int] | None = None) -> torch.Tensor:
    """``x [M, K] @ (q * s).T (+ bias)`` → ``[M, N]`` in x's dtype, M ≤ 16; with ``gate`` x is
    ``[M, 2K]`` (``[gate | up]``). ``config`` overrides :func:`gemv_config` (benchmarks)."""
    m = x.shape[0]
    n, k = weight.rows, weight.cols
    if m > MAX_ROWS:
        raise ValueError(f"fp8 GEMV: at most {MAX_ROWS} rows, got {m}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    block_m, block_n, block_k, warps = config or gemv_config(m, n, k, weight.block)
    if weight.block and (BLOCK % block_n or block_k % BLOCK
                         or (block_m > 1 and block_k != BLOCK)):
        raise ValueError(f"fp8 GEMV config {config}: block-wise weights need BLOCK_N dividing "
                         f"{BLOCK} and BLOCK_K a multiple of it ({BLOCK} for several rows)")
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    use_pdl = pdl_enabled(x) and block_m == 1
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x, weight.data, weight.scale, bias if bias is not None else weight.scale, y, m, n, k,
        x.stride(0), weight.data.stride(0), weight.scale.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        EVEN_K=k % block_k == 0, EVEN_N=n % block_n == 0, BLOCKWISE=weight.block,
        GATE=-1 if gate is None else KINDS[gate],
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        USE_PDL=use_pdl, num_warps=warps, launch_pdl=use_pdl)
    return y
