"""The small-batch product of an FP4 weight on the CUDA cores: ``y = x @ W.T (+ b)`` for up to
a few rows of x, decoding each weight once for all of them, in float32.

The structure is the integer kernel's (``tallow-quant-int4``): a program owns ``BN`` weight
rows and ``BM`` rows of x; every thread takes one quad (16 bytes, 32 codes) of each of its
rows per iteration, the warps side by side along K, and reuses each activation for its ``BN``
rows and each decoded weight for its ``BM`` rows of x; the next tile's codes and scales are
loaded before the current ones are used (and, with PDL, before waiting for the kernel that
wrote x). Codes are decoded two at a time by
:func:`~tallow_quant_fp4.kernels.decode.e2m1_pair` (slots s and s + 4 of a word); the group's
scale multiplies the partial sum of its columns (a quad is one MXFP4 group, or two NVFP4
groups: slots 0-3 and 4-7). NVFP4's global scale divides each output once, after the sum, not
every group's scale. Warps per program along K: :mod:`tallow.kernels.quad_gemv`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tallow.kernels import (
    ACTIVATION_KINDS as KINDS,
    allow_next,
    load_activations,
    pdl_enabled,
    quad_launch_config as launch_config,
    quad_tile_mask as tile_mask,
    step_jit,
    wait_prior,
)

from ..layout import FP4Weight
from .decode import PAIR_FACTOR, PAIR_MAGNITUDES, PAIR_SIGNS, e2m1_pair, e4m3_value, scale_value


@triton.jit
def _load_tile(q_ptr, s_ptr, rows, quads, qmask, stride_q, stride_s, NV: tl.constexpr):
    """Codes ``[BN, Q, 4]`` and scale bytes (``[BN, Q]``; NVFP4: the second group's too)."""
    u3 = tl.arange(0, 4)[None, None, :]
    r2 = rows[:, None]
    codes = tl.load(
        q_ptr + rows[:, None, None] * stride_q + quads[:, :, None] * 4 + u3,
        mask=qmask[:, :, None],
        other=0,
    )
    if NV:
        s0 = tl.load(s_ptr + r2 * stride_s + 2 * quads, mask=qmask, other=0)
        s1 = tl.load(s_ptr + r2 * stride_s + 2 * quads + 1, mask=qmask, other=0)
    else:
        s0 = tl.load(s_ptr + r2 * stride_s + quads, mask=qmask, other=0)
        s1 = s0
    return codes, s0, s1


@step_jit(values=["M"], pointers=["x_ptr", "y_ptr", "b_ptr"])
def _gemv_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    b_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_ym,
    stride_q,
    stride_s,
    global_scale,
    mag_mask,
    sign_mask,
    BM: tl.constexpr,
    BN: tl.constexpr,
    Q: tl.constexpr,
    NV: tl.constexpr,
    PREFETCH: tl.constexpr,
    EVEN_N: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GATE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    m_blocks = tl.cdiv(M, BM)
    pid_m = tl.program_id(0) % m_blocks
    pid_n = tl.program_id(0) // m_blocks
    X_TY: tl.constexpr = x_ptr.dtype.element_ty
    n_quads = K // 32
    rows = pid_n * BN + tl.arange(0, BN)
    q_in = tl.arange(0, Q)[None, :]
    u4 = tl.arange(0, 4)
    offs_m = pid_m * BM + tl.arange(0, BM)
    m_ok = offs_m < M
    xrow = x_ptr + offs_m.to(tl.int64)[:, None, None, None] * stride_xm
    m4 = m_ok[:, None, None, None]
    if PREFETCH:  # the weights are no kernel's output: requested before the wait for x
        tile = _load_tile(
            q_ptr,
            s_ptr,
            rows,
            q_in,
            tile_mask(rows, q_in, N, n_quads, EVEN_N),
            stride_q,
            stride_s,
            NV,
        )
    wait_prior(USE_PDL)
    allow_next(USE_PDL)
    acc = tl.zeros((BM, BN, Q), dtype=tl.float32)
    for q0 in range(0, n_quads, Q):
        quads = q0 + q_in
        if PREFETCH:
            nxt = quads + Q
            upcoming = _load_tile(
                q_ptr,
                s_ptr,
                rows,
                nxt,
                tile_mask(rows, nxt, N, n_quads, EVEN_N),
                stride_q,
                stride_s,
                NV,
            )
        else:
            tile = _load_tile(
                q_ptr,
                s_ptr,
                rows,
                quads,
                tile_mask(rows, quads, N, n_quads, EVEN_N),
                stride_q,
                stride_s,
                NV,
            )
        codes, s0, s1 = tile
        cols = (quads * 32)[None, :, :, None] + u4[None, None, None, :]
        xmask = m4 & (quads < n_quads)[None, :, :, None]
        first = tl.zeros((BM, BN, Q, 4), dtype=tl.float32)
        second = tl.zeros((BM, BN, Q, 4), dtype=tl.float32)
        for s in tl.static_range(4):  # slots s and s + 4: columns 4s + u and 16 + 4s + u
            lo, hi = e2m1_pair(codes, s, mag_mask, sign_mask)
            first += lo[None] * load_activations(xrow + cols + 4 * s, xmask, K, GATE, X_TY)
            second += hi[None] * load_activations(xrow + cols + 16 + 4 * s, xmask, K, GATE, X_TY)
        if NV:  # the e4m3 scales; the global scale divides each output once, at the end
            acc += e4m3_value(s0.to(tl.int32))[None] * tl.sum(first, axis=3) + e4m3_value(
                s1.to(tl.int32)
            )[None] * tl.sum(second, axis=3)
        else:
            acc += scale_value(s0, global_scale, NV)[None] * tl.sum(first + second, axis=3)
        if PREFETCH:
            tile = upcoming
    y = tl.sum(acc, axis=2) * 16384.0  # 1 / PAIR_FACTOR, a power of two: exact
    if NV:
        y = tl.math.div_rn(y, global_scale)
    n_ok = rows < N
    if HAS_BIAS:
        y += tl.load(b_ptr + rows, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out = y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + rows[None, :]
    tl.store(out, y.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


#: (rows of x, weight rows, warps, prefetch) per program, by rows of x (a power of two), for
#: MXFP4 and for NVFP4 (whose two scales per quad need more registers: fewer weight rows at one
#: row of x). Counted offline for sm_90 (``tests/test_compile.py``): MXFP4 spends about 5.8
#: SASS instructions per weight at one row (e2m1 codes decoded in pairs through float16 bits,
#: :func:`~tallow_quant_fp4.kernels.decode.e2m1_pair`), 4.0 per weight and row at two rows and
#: 3.4 at four; NVFP4 6.1, 4.4 and 3.6. The warps are the fewest:
#: :func:`tallow.kernels.quad_gemv.launch_config` adds warps along K where a shape launches too
#: few programs to fill the GPU.
DEFAULT_CONFIGS = {
    1: (1, 8, 1, True),
    2: (2, 4, 1, True),
    4: (4, 2, 1, True),
    8: (4, 2, 1, True),
    16: (4, 2, 1, True),
}
NV_CONFIGS = {
    1: (1, 4, 1, True),
    2: (2, 4, 1, True),
    4: (4, 2, 1, True),
    8: (4, 2, 1, True),
    16: (4, 2, 1, True),
}

assert PAIR_FACTOR == 1.0 / 16384.0  # the kernel's last multiplication undoes it


def gemv_config(
    m: int, n: int, k: int, nv: bool = False, device: torch.device | None = None
) -> tuple[int, int, int, bool]:
    """(BM, BN, warps, prefetch) for ``m`` rows of x (at most 16) by an ``[n, k]`` weight
    (``nv``: NVFP4) on ``device`` (default: the current CUDA device); the warps along K from
    :func:`tallow.kernels.quad_gemv.launch_config`."""
    bucket = 1 << max(0, (m - 1).bit_length())
    table = NV_CONFIGS if nv else DEFAULT_CONFIGS
    if bucket not in table:
        raise ValueError(f"gemv: {m} rows of x is more than the small-batch kernel takes (16)")
    device = device if device is not None else torch.device("cuda")
    return launch_config(table[bucket], m, n, k // 32, device)


def gemv_triton(
    x: torch.Tensor,
    w: FP4Weight,
    bias: torch.Tensor | None = None,
    *,
    gate: str | None = None,
    config: tuple[int, int, int, bool] | None = None,
) -> torch.Tensor:
    """``x [M, K] @ W.T (+ bias)`` → ``[M, N]`` in x's dtype (``x [M, 2K]``, ``[gate | up]``,
    with ``gate``). ``config`` is ``(BM, BN, warps, prefetch)``."""
    m = x.shape[0]
    n, k = w.rows, w.cols
    if x.stride(-1) != 1:
        x = x.contiguous()
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    bm, bn, warps, prefetch = config or gemv_config(m, n, k, w.kind == "nvfp4", x.device)
    use_pdl = pdl_enabled(x)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _gemv_kernel[grid](
        x,
        w.codes,
        w.scales,
        bias if bias is not None else w.scales,
        out,
        m,
        n,
        k,
        x.stride(0),
        out.stride(0),
        w.codes.stride(0),
        w.scales.stride(0),
        w.global_scale,
        PAIR_MAGNITUDES,
        PAIR_SIGNS,
        BM=bm,
        BN=bn,
        Q=32 * warps,
        NV=w.kind == "nvfp4",
        PREFETCH=prefetch,
        EVEN_N=n % bn == 0,
        HAS_BIAS=bias is not None,
        GATE=-1 if gate is None else KINDS[gate],
        USE_PDL=use_pdl,
        num_warps=warps,
        num_stages=1,
        launch_pdl=use_pdl,
    )
    return out
