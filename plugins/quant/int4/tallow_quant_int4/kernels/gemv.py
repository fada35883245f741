"""The small-batch product on the CUDA cores: ``y = x @ W.T (+ b)`` for ``M`` up to a few
rows of x, decoding each weight once for all of them, in float32.

At batch 1 a decode step streams every weight once: a 4-bit weight carries four times as
many values per byte as a bf16 one, so the kernel keeps up with memory only if it spends few
instructions per weight. So:

- A program owns ``BN`` weight rows, ``BM`` rows of x and ``num_warps`` warps; each
  iteration every thread takes one quad (16 bytes: 32 four-bit or 16 eight-bit codes) of each
  of its ``BN`` rows, the warps side by side along K (``Q = 32 * num_warps`` quads per
  iteration), and reuses every activation it loads for its ``BN`` rows and every decoded
  weight for its ``BM`` rows of x.
- Codes become float32 without a conversion instruction: one shift puts a byte of a word in
  bits 15..22, and a mask-and-or with the bits of 256.0 (16.0) makes a word that, read as a
  float, *is* ``256 + q`` for the low nibble (``16 + q`` for the high one; ``256 + q`` for a
  byte code). The masks and magic words are runtime arguments, so the compiler keeps them in
  registers and forms one three-input logic instruction per value. One fused multiply-add per
  weight and row of x remains.
- ``sum((256 + q) x) = 256 sum(x) + sum(q x)``: the offsets, and the zero point ``z``, come
  out once per quad through the sums of the activations (``sum((q - z) x) =
  sum(v x) - (256 + z) sum(x_lo) - (16 + z) sum(x_hi)``), which every row shares. The group's
  scale multiplies the quad's partial sum.
- The next iteration's codes and scales are loaded before the current ones are used
  (``PREFETCH``); with Programmatic Dependent Launch the first tile is requested before the
  kernel waits for the one that wrote x.

Every product is a float32 product of the exact code and the exact activation; only the order
of the float32 additions differs from the reference. The activation of a gated MLP can be
applied as x is read (``GATE``): x is then ``[gate | up]``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tallow.kernels import (
    ACTIVATION_KINDS as KINDS,
    allow_next,
    bit_constants,
    bits_as_float,
    byte_to_bits_15,
    load_activations,
    pdl_enabled,
    quad_launch_config as launch_config,
    quad_tile_mask as tile_mask,
    step_jit,
    wait_prior,
)

from ..layout import QUAD_COLUMNS, IntWeight


@triton.jit
def _load_tile(
    q_ptr,
    s_ptr,
    z_ptr,
    rows,
    quads,
    qmask,
    stride_q,
    stride_s,
    QC: tl.constexpr,
    GROUP: tl.constexpr,
    ZEROS: tl.constexpr,
):
    """Codes ``[BN, Q, 4]``, scales and zero points ``[BN, Q]`` of quads ``quads [1, Q]`` of
    ``rows [BN]``; entries outside ``qmask`` (``[BN or 1, Q]``) read as zero."""
    u3 = tl.arange(0, 4)[None, None, :]
    grp = (quads * QC) // GROUP
    r2 = rows[:, None]
    r3 = rows[:, None, None]
    codes = tl.load(
        q_ptr + r3 * stride_q + quads[:, :, None] * 4 + u3, mask=qmask[:, :, None], other=0
    )
    scale = tl.load(s_ptr + r2 * stride_s + grp, mask=qmask, other=0.0)
    zero = scale
    if ZEROS:
        zero = tl.load(z_ptr + r2 * stride_s + grp, mask=qmask, other=0)
    return codes, scale, zero


@step_jit(values=["M"], pointers=["x_ptr", "y_ptr", "b_ptr"])
def _gemv_kernel(
    x_ptr,
    q_ptr,
    s_ptr,
    z_ptr,
    b_ptr,
    y_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_ym,
    stride_q,
    stride_s,
    mask_lo,
    mask_hi,
    magic_lo,
    magic_hi,
    BM: tl.constexpr,
    BN: tl.constexpr,
    Q: tl.constexpr,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    ZEROS: tl.constexpr,
    PREFETCH: tl.constexpr,
    EVEN_N: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    GATE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    # one axis, x blocks fastest: the programs that share a weight tile run side by side
    m_blocks = tl.cdiv(M, BM)
    pid_m = tl.program_id(0) % m_blocks
    pid_n = tl.program_id(0) // m_blocks
    QC: tl.constexpr = 32 if BITS == 4 else 16  # columns of a quad
    X_TY: tl.constexpr = x_ptr.dtype.element_ty
    n_quads = K // QC
    rows = pid_n * BN + tl.arange(0, BN)
    q_in = tl.arange(0, Q)[None, :]  # [1, Q]
    u4 = tl.arange(0, 4)
    offs_m = pid_m * BM + tl.arange(0, BM)
    m_ok = offs_m < M
    # x tiles are [BM, 1, Q, 4]: broadcast over the BN rows of the weight tile
    xrow = x_ptr + offs_m.to(tl.int64)[:, None, None, None] * stride_xm
    m4 = m_ok[:, None, None, None]

    if PREFETCH:  # the weights are no kernel's output: requested before the wait for x
        tile = _load_tile(
            q_ptr,
            s_ptr,
            z_ptr,
            rows,
            q_in,
            tile_mask(rows, q_in, N, n_quads, EVEN_N),
            stride_q,
            stride_s,
            QC,
            GROUP,
            ZEROS,
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
                z_ptr,
                rows,
                nxt,
                tile_mask(rows, nxt, N, n_quads, EVEN_N),
                stride_q,
                stride_s,
                QC,
                GROUP,
                ZEROS,
            )
        else:
            tile = _load_tile(
                q_ptr,
                s_ptr,
                z_ptr,
                rows,
                quads,
                tile_mask(rows, quads, N, n_quads, EVEN_N),
                stride_q,
                stride_s,
                QC,
                GROUP,
                ZEROS,
            )
        codes, scale, zero = tile
        cols = (quads * QC)[None, :, :, None] + u4[None, None, None, :]  # [1, 1, Q, 4]
        xmask = m4 & (quads < n_quads)[None, :, :, None]
        if BITS == 4:
            # byte p of each word: slot 2p (column 8p + u, 256 + q) and slot 2p + 1
            # (column 8p + 4 + u, 16 + q)
            t = byte_to_bits_15(codes, 0)[None]
            x_lo = load_activations(xrow + cols, xmask, K, GATE, X_TY)
            x_hi = load_activations(xrow + cols + 4, xmask, K, GATE, X_TY)
            part = bits_as_float(t, mask_lo, magic_lo) * x_lo
            part += bits_as_float(t, mask_hi, magic_hi) * x_hi
            for p in tl.static_range(1, 4):
                t = byte_to_bits_15(codes, p)[None]
                xl = load_activations(xrow + cols + 8 * p, xmask, K, GATE, X_TY)
                xh = load_activations(xrow + cols + 8 * p + 4, xmask, K, GATE, X_TY)
                part += bits_as_float(t, mask_lo, magic_lo) * xl
                part += bits_as_float(t, mask_hi, magic_hi) * xh
                x_lo += xl
                x_hi += xh
            s_lo = tl.sum(x_lo, axis=3)  # [BM, 1, Q]
            s_hi = tl.sum(x_hi, axis=3)
            dot = tl.sum(part, axis=3)  # [BM, BN, Q]
            if ZEROS:
                z = zero.to(tl.float32)[None]
                dot = dot - (256.0 * s_lo + 16.0 * s_hi) - z * (s_lo + s_hi)
            else:
                dot = dot - (264.0 * s_lo + 24.0 * s_hi)
        else:
            # byte p of each word: slot p (column 4p + u), 256 + q
            x8 = load_activations(xrow + cols, xmask, K, GATE, X_TY)
            part = bits_as_float(byte_to_bits_15(codes, 0)[None], mask_lo, magic_lo) * x8
            for p in tl.static_range(1, 4):
                xv = load_activations(xrow + cols + 4 * p, xmask, K, GATE, X_TY)
                part += bits_as_float(byte_to_bits_15(codes, p)[None], mask_lo, magic_lo) * xv
                x8 += xv
            s8 = tl.sum(x8, axis=3)
            dot = tl.sum(part, axis=3)
            if ZEROS:
                dot = dot - (256.0 + zero.to(tl.float32)[None]) * s8
            else:
                dot = dot - 384.0 * s8
        acc += scale.to(tl.float32)[None] * dot
        if PREFETCH:
            tile = upcoming

    y = tl.sum(acc, axis=2)  # [BM, BN]
    n_ok = rows < N
    if HAS_BIAS:
        y += tl.load(b_ptr + rows, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out = y_ptr + offs_m.to(tl.int64)[:, None] * stride_ym + rows[None, :]
    tl.store(out, y.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


#: (rows of x, weight rows, warps, prefetch) per program, by rows of x (rounded up to a power of
#: two). Counted offline for sm_90 (``tests/test_compile.py``): 3.5 SASS instructions per
#: weight at one row (eight weight rows share each activation's conversion and sums), about 3
#: per weight and row of x from two rows on. More than 4 rows of x in one program would spill,
#: so 8 and 16 rows run as 2 and 4 programs side by side on the same weight rows (neighbours
#: in the launch order: the second reads them from the cache). The warps are the fewest:
#: :func:`tallow.kernels.quad_gemv.launch_config` adds warps along K where a shape launches
#: too few programs to fill the GPU.
DEFAULT_CONFIGS = {
    1: (1, 8, 1, True),
    2: (2, 4, 1, True),
    4: (4, 2, 1, True),
    8: (4, 2, 1, True),
    16: (4, 2, 1, True),
}
#: elements a tensor may have: the kernels index them with 32-bit offsets
MAX_ELEMENTS = 2**31 - 1


def gemv_config(
    m: int, n: int, k: int, bits: int = 4, device: torch.device | None = None
) -> tuple[int, int, int, bool]:
    """(BM, BN, warps, prefetch) for ``m`` rows of x (at most 16) by a ``[n, k]`` weight of
    ``bits``-bit codes on ``device`` (default: the current CUDA device)."""
    bucket = 1 << max(0, (m - 1).bit_length())
    if bucket not in DEFAULT_CONFIGS:
        raise ValueError(f"gemv: {m} rows of x is more than the small-batch kernel takes (16)")
    device = device if device is not None else torch.device("cuda")
    return launch_config(DEFAULT_CONFIGS[bucket], m, n, k // QUAD_COLUMNS[bits], device)


def gemv_triton(
    x: torch.Tensor,
    w: IntWeight,
    bias: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    gate: str | None = None,
    config: tuple[int, int, int, bool] | None = None,
) -> torch.Tensor:
    """``x [M, K] @ W.T (+ bias)`` → ``[M, N]`` in x's dtype, ``W`` in the layout's column
    order (``x [M, 2K]``, ``[gate | up]``, with ``gate``). ``out`` (``[M, N]`` with unit
    column stride, e.g. a column slice of a wider output) receives it in place. ``config`` is
    ``(BM, BN, warps, prefetch)``."""
    m = x.shape[0]
    n, k = w.rows, w.cols
    if max(w.codes.numel(), x.numel()) > MAX_ELEMENTS:
        raise ValueError(
            f"gemv: a [{n}, {k}] weight or [{m}, {k}] input is more than 32-bit offsets address"
        )
    if x.stride(-1) != 1:
        x = x.contiguous()
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    bm, bn, warps, prefetch = config or gemv_config(m, n, k, w.bits, x.device)
    q = 32 * warps
    use_pdl = pdl_enabled(x)
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _gemv_kernel[grid](
        x,
        w.codes,
        w.scales,
        w.zeros if w.zeros is not None else w.scales,
        bias if bias is not None else w.scales,
        out,
        m,
        n,
        k,
        x.stride(0),
        out.stride(0),
        w.codes.stride(0),
        w.scales.stride(0),
        *bit_constants(w.bits == 8),
        BM=bm,
        BN=bn,
        Q=q,
        BITS=w.bits,
        GROUP=w.group,
        ZEROS=w.zeros is not None,
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
