"""Triton matrix-vector products for decode: ``y = x @ W.T (+ b)`` for a handful of rows.

At batch 1 a decode step is a chain of weight reads, and the speed of the whole model is the
speed at which these kernels stream ``W`` from HBM. Each program owns ``BLOCK_N`` output
features and walks the whole ``K`` dimension, so every weight byte is read exactly once and
no cross-program reduction is needed.

One row (``BLOCK_M == 1``) multiplies elementwise and accumulates a ``[BLOCK_N, BLOCK_K]`` tile
in float32, reducing across ``K`` once at the end. A few rows (2–16) pad to 16 and use
``tl.dot``: the tensor cores are idle anyway, and the weight tile is loaded once for all rows.

Launched with Programmatic Dependent Launch (:mod:`tallow.kernels.pdl`), a one-row program
issues its first weight tile before waiting for the kernel that produced ``x``: the weight
stream starts while that kernel's last wave still runs. ``W`` must therefore be memory no kernel
of the step writes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .activation_triton import KINDS, gated_value
from .pdl import allow_next, pdl_enabled, wait_prior


@triton.jit
def _load_w(w_ptrs, k, offs_k, n_mask, K, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr):
    """The weight tile whose first column is ``k`` (zeros past N and K)."""
    if EVEN_K:
        if EVEN_N:
            w = tl.load(w_ptrs)
        else:
            w = tl.load(w_ptrs, mask=n_mask[:, None], other=0.0)
    else:
        k_mask = (k + offs_k) < K
        w = tl.load(w_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
    return w


@triton.jit
def _load_x(x_ptrs, k, offs_k, m_mask, K, EVEN_K: tl.constexpr, GATE: tl.constexpr):
    """The input tile whose first column is ``k`` (zeros past M and K). With a gate (``GATE``
    >= 0, a kind of :data:`activation_triton.KINDS`) each row of x is ``[gate | up]``, K wide
    each, and the tile is ``act(gate) * up``."""
    if EVEN_K:
        mask = m_mask[:, None]
    else:
        mask = m_mask[:, None] & ((k + offs_k) < K)[None, :]
    x = tl.load(x_ptrs, mask=mask, other=0.0)
    if GATE >= 0:
        up = tl.load(x_ptrs + K, mask=mask, other=0.0)
        x = gated_value(x, up, GATE, x_ptrs.dtype.element_ty)
    return x


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_ym,
                 HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr,
                 GATE: tl.constexpr, USE_PDL: tl.constexpr):
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    offs_m = tl.arange(0, BLOCK_M)
    n_mask = offs_n < N
    m_mask = offs_m < M
    w_ptrs = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    x_ptrs = x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :]
    k_first = 0
    if USE_PDL and BLOCK_M == 1:
        # The weights are no kernel's output: stream the first tile while the previous kernel
        # finishes (see pdl.py), then wait for x and run the first K step outside the loop.
        w = _load_w(w_ptrs, 0, offs_k, n_mask, K, EVEN_K, EVEN_N)
        wait_prior(USE_PDL)
        allow_next(USE_PDL)
        x = _load_x(x_ptrs, 0, offs_k, m_mask, K, EVEN_K, GATE)
        acc = w.to(tl.float32) * x.to(tl.float32)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
        k_first = BLOCK_K
    else:
        # no PDL (the wait is then no code at all), or several rows (tl.dot): the loop as it
        # always was, behind the wait
        wait_prior(USE_PDL)
        allow_next(USE_PDL)
        if BLOCK_M == 1:
            acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        else:
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k in range(k_first, K, BLOCK_K):
        w = _load_w(w_ptrs, k, offs_k, n_mask, K, EVEN_K, EVEN_N)
        x = _load_x(x_ptrs, k, offs_k, m_mask, K, EVEN_K, GATE)
        if BLOCK_M == 1:
            acc += w.to(tl.float32) * x.to(tl.float32)
        else:
            acc = tl.dot(x, tl.trans(w), acc)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    if BLOCK_M == 1:
        y = tl.sum(acc, axis=1)[None, :]
    else:
        y = acc
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
    tl.store(y_ptrs, y.to(y_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


def gemv_config(m: int, n: int, k: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps) for an ``m x k`` by ``k x n`` product.

    One row: four output features per program and long K steps. On an H200 (timed inside a
    CUDA graph, llama-3-8b and qwen3-0.6b shapes, see ``bench/gpu/profile_decode.py gemv``)
    this streams 3.4–4.5 TB/s where cuBLAS gives 2.5–4.2: many small programs keep more loads
    in flight than a few wide ones.
    """
    if m == 1:
        if k >= 2048:
            return 1, 4, 2048, 4
        return 1, 4, max(16, min(1024, triton.next_power_of_2(k))), 2
    return 16, 32, min(256, max(16, triton.next_power_of_2(k))), 4


def gemv_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                *, config: tuple[int, int, int, int] | None = None,
                gate: str | None = None) -> torch.Tensor:
    """``x [M, K] @ weight [N, K].T (+ bias [N])`` → [M, N] in x's dtype, M ≤ 16 (checked by
    the caller). ``config`` overrides the block sizes (benchmarks sweep it). With ``gate``
    ("silu" or "gelu_tanh") x is ``[M, 2K]``, ``[gate | up]`` per row, and the product is
    ``(act(gate) * up) @ weight.T``, the activation computed as the kernel reads x."""
    m = x.shape[0]
    n, k = weight.shape
    block_m, block_n, block_k, warps = config or gemv_config(m, n, k)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(n, block_n),)
    use_pdl = pdl_enabled(x)
    _gemv_kernel[grid](
        x, weight, bias if bias is not None else weight, y, m, n, k,
        x.stride(0), weight.stride(0), y.stride(0),
        HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        # EVEN_K reads the first tile unmasked: K = 0 takes the masked path
        EVEN_K=k > 0 and k % block_k == 0, EVEN_N=n % block_n == 0,
        GATE=-1 if gate is None else KINDS[gate], USE_PDL=use_pdl,
        num_warps=warps, launch_pdl=use_pdl)
    return y
