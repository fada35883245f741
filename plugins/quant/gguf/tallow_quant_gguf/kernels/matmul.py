"""The fused quantized matmul: ``y = x @ W.T (+ b)`` decoding ``W`` tile by tile as it goes.

One kernel, three shapes of program (:func:`matmul_config`):

- **one row** (batch-1 decode): a program owns ``BN`` output features and walks ``K`` in steps
  of ``H`` half-chunks (16 elements each), like the bf16 GEMV of
  :mod:`tallow.kernels.gemv_triton`. Each thread holds 8 consecutive elements of a group and
  adds ``s * sum(f(q) * x) - m * sum(x)``: about four instructions per weight (unpack, convert
  the code and the activation, one fused multiply-add) rather than the nine of forming each
  weight, since at batch 1 the H200 would otherwise run out of instruction issue before it
  runs out of memory bandwidth. Every weight byte is read once, in 8-byte vectors of codes per
  thread (see :mod:`~tallow_quant_gguf.kernels.decode` for why 8); with Programmatic
  Dependent Launch the first tile is loaded and decoded before the kernel waits for the one
  that wrote ``x``.
- **a few rows** (2-16): the decoded tile, rounded to x's dtype, goes through ``tl.dot`` with
  the rows padded to 16; the weights are still read once.
- **many rows**: the same ``tl.dot`` loop on ``BM x BN`` output tiles (a GEMM that decodes its
  weight tiles in registers; large batches may instead decode to a workspace and call cuBLAS,
  see :mod:`tallow_quant_gguf.ops`).

Split-K: when too few programs cover ``N`` to fill the GPU, each program takes a slice of
``K`` and writes float32 partial sums, which are added afterwards.

The activation of a gated MLP can be applied as ``x`` is read (``GATE``): x is then
``[gate | up]`` per row, as in the bf16 GEMV.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from tallow.kernels.activation_triton import KINDS, gated_value
from tallow.kernels.jit import step_jit
from tallow.kernels.pdl import allow_next, pdl_enabled, wait_prior

from ..packing import PackedWeight
from .decode import combine, decode_parts, element_offsets, plane_args, type_constants


@triton.jit
def _load_x(x_ptr, offs_m, m_mask, halves, half_mask, K, stride_xm, BM: tl.constexpr,
            BN: tl.constexpr, GATE: tl.constexpr):
    """The activations matching a decoded tile's low and high halves. One row (``BM == 1``)
    is read in the tile's own ``[BN, H, 8]`` shape, every tile row reading the same addresses,
    so that it shares the weights' register layout; several rows come as ``[BM, H, 8]``. With
    a gate, each value is ``act(gate) * up``, rounded as the activation kernel rounds it."""
    if BM == 1:
        base = x_ptr + (offs_m.to(tl.int64) * stride_xm)[:, None, None] + element_offsets(
            halves, BN)
    else:
        base = x_ptr + offs_m[:, None, None].to(tl.int64) * stride_xm + element_offsets(
            halves, 1)
    mask = m_mask[:, None, None] & half_mask[None, :, None]
    x_lo = tl.load(base, mask=mask, other=0.0)
    x_hi = tl.load(base + 16, mask=mask, other=0.0)
    if GATE >= 0:
        x_lo = gated_value(x_lo, tl.load(base + K, mask=mask, other=0.0), GATE,
                           x_ptr.dtype.element_ty)
        x_hi = gated_value(x_hi, tl.load(base + K + 16, mask=mask, other=0.0), GATE,
                           x_ptr.dtype.element_ty)
    return x_lo, x_hi


@triton.jit
def _accumulate(acc, parts, x_lo, x_hi, BM: tl.constexpr, BN: tl.constexpr, H: tl.constexpr,
                MINS: tl.constexpr, DOT_PRECISION: tl.constexpr):
    f_lo, f_hi, s_lo, s_hi, m_lo, m_hi = parts
    if BM == 1:
        # per 8-element group: s * sum(f * x) - m * sum(x), the sums in registers of one
        # thread; the decoded weights themselves are never formed
        xl = x_lo.to(tl.float32)
        xh = x_hi.to(tl.float32)
        acc += s_lo * tl.sum(f_lo * xl, axis=2) + s_hi * tl.sum(f_hi * xh, axis=2)
        if MINS != 0:
            acc -= m_lo * tl.sum(xl, axis=2) + m_hi * tl.sum(xh, axis=2)
    else:
        ty = x_lo.dtype
        a_lo = tl.reshape(x_lo, (BM, H * 8))
        a_hi = tl.reshape(x_hi, (BM, H * 8))
        b_lo = tl.reshape(combine(f_lo, s_lo, m_lo, MINS).to(ty), (BN, H * 8))
        b_hi = tl.reshape(combine(f_hi, s_hi, m_hi, MINS).to(ty), (BN, H * 8))
        acc = tl.dot(a_lo, tl.trans(b_lo), acc, input_precision=DOT_PRECISION)
        acc = tl.dot(a_hi, tl.trans(b_hi), acc, input_precision=DOT_PRECISION)
    return acc


@step_jit(values=["M"], pointers=["x_ptr", "y_ptr", "b_ptr"])
def _qmatmul_kernel(x_ptr, nib_ptr, pair_ptr, bit_ptr, byte_ptr, d_ptr, dm_ptr, sc_ptr, mn_ptr,
                    lut_ptr, b_ptr, y_ptr, M, N, K, stride_xm, stride_ym, stride_split,
                    halves_per_split, s_nib, s_pair, s_bit, s_byte, s_d, s_sc,
                    BM: tl.constexpr, BN: tl.constexpr, H: tl.constexpr,
                    NIB: tl.constexpr, PAIR: tl.constexpr, BIT: tl.constexpr,
                    BYTE: tl.constexpr, OFFSET: tl.constexpr, LUT: tl.constexpr,
                    GROUP: tl.constexpr, QBLOCK: tl.constexpr, SCALES: tl.constexpr,
                    MINS: tl.constexpr, BIT_SHIFT: tl.constexpr,
                    HAS_BIAS: tl.constexpr, PARTIAL: tl.constexpr, GATE: tl.constexpr,
                    DOT_PRECISION: tl.constexpr, USE_PDL: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rows = pid_n * BN + tl.arange(0, BN)
    row_mask = rows < N
    offs_m = pid_m * BM + tl.arange(0, BM)
    m_mask = offs_m < M
    h_begin = pid_k * halves_per_split
    h_end = tl.minimum(h_begin + halves_per_split, K // 16)

    # the first tile is weights only: decoded while the previous kernel finishes (PDL)
    halves = h_begin + tl.arange(0, H)
    half_mask = halves < h_end
    parts = decode_parts(nib_ptr, pair_ptr, bit_ptr, byte_ptr, d_ptr, dm_ptr, sc_ptr, mn_ptr,
                         lut_ptr, rows, row_mask, halves, half_mask,
                         s_nib, s_pair, s_bit, s_byte, s_d, s_sc, BN, H,
                         NIB, PAIR, BIT, BYTE, OFFSET, LUT, GROUP, QBLOCK, SCALES, MINS,
                         BIT_SHIFT)
    wait_prior(USE_PDL)
    allow_next(USE_PDL)
    if BM == 1:
        acc = tl.zeros((BN, H), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    x_lo, x_hi = _load_x(x_ptr, offs_m, m_mask, halves, half_mask, K, stride_xm, BM, BN, GATE)
    acc = _accumulate(acc, parts, x_lo, x_hi, BM, BN, H, MINS, DOT_PRECISION)
    for h0 in range(h_begin + H, h_end, H):
        halves = h0 + tl.arange(0, H)
        half_mask = halves < h_end
        parts = decode_parts(nib_ptr, pair_ptr, bit_ptr, byte_ptr, d_ptr, dm_ptr, sc_ptr,
                             mn_ptr, lut_ptr, rows, row_mask, halves, half_mask,
                             s_nib, s_pair, s_bit, s_byte, s_d, s_sc, BN, H,
                             NIB, PAIR, BIT, BYTE, OFFSET, LUT, GROUP, QBLOCK, SCALES, MINS,
                             BIT_SHIFT)
        x_lo, x_hi = _load_x(x_ptr, offs_m, m_mask, halves, half_mask, K, stride_xm, BM, BN,
                             GATE)
        acc = _accumulate(acc, parts, x_lo, x_hi, BM, BN, H, MINS, DOT_PRECISION)

    if BM == 1:
        y = tl.sum(acc, axis=1)[None, :]
    else:
        y = acc
    mask = m_mask[:, None] & row_mask[None, :]
    out = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + rows[None, :]
    if PARTIAL:
        tl.store(out + pid_k * stride_split, y, mask=mask)
    else:
        if HAS_BIAS:
            y += tl.load(b_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(out, y.to(y_ptr.dtype.element_ty), mask=mask)


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def matmul_config(m: int, n: int, k: int) -> tuple[int, int, int, int, int]:
    """(BM, BN, H, num_warps, num_stages) for ``x [m, k] @ W [n, k].T``; H counts 8-byte
    half-chunks (16 elements) per K step. Starting points for the H200, to be tuned from
    ``bench/gpu/quant_micro.py``."""
    halves = k // 16
    if m == 1:
        return 1, 4, min(64, triton.next_power_of_2(halves)), 4, 2
    if m <= 16:
        return 16, 32, min(8, triton.next_power_of_2(halves)), 4, 3
    if m <= 64:
        return 64, 64, min(8, triton.next_power_of_2(halves)), 4, 3
    return 128, 128, min(4, triton.next_power_of_2(halves)), 8, 3


def split_count(programs: int, steps: int, device: torch.device) -> int:
    """How many slices of K to give each output tile: enough programs for two waves of the
    GPU's SMs, each slice still at least two K steps (of ``steps`` in all) long."""
    if device.type != "cuda":
        return 1
    target = 2 * _sm_count(device.index if device.index is not None
                           else torch.cuda.current_device())
    if programs >= target:
        return 1
    return max(1, min(triton.cdiv(target, programs), steps // 2, 16))


def qmatmul_triton(x: torch.Tensor, p: PackedWeight, bias: torch.Tensor | None = None, *,
                   out: torch.Tensor | None = None, gate: str | None = None,
                   config: tuple[int, int, int, int, int] | None = None,
                   split: int | None = None) -> torch.Tensor:
    """``x [M, K] @ W.T (+ bias)`` → ``[M, N]`` in x's dtype (``x [M, 2K]`` with ``gate``).
    ``out`` (``[M, N]``, rows contiguous, e.g. a column slice of a wider output) receives it in
    place. ``config`` and ``split`` override the heuristics (benchmarks sweep them)."""
    m = x.shape[0]
    n, k = p.rows, p.cols
    if x.stride(-1) != 1:
        x = x.contiguous()
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    bm, bn, h, warps, stages = config or matmul_config(m, n, k)
    halves = k // 16
    grid_n, grid_m = triton.cdiv(n, bn), triton.cdiv(m, bm)
    if split is None:
        split = split_count(grid_n * grid_m, triton.cdiv(halves, h), x.device)
    per_split = triton.cdiv(triton.cdiv(halves, split), h) * h
    split = triton.cdiv(halves, per_split)
    partial = split > 1
    target = torch.empty(split, m, n, dtype=torch.float32, device=x.device) if partial else out
    ptrs, strides = plane_args(p)
    use_pdl = pdl_enabled(x)
    _qmatmul_kernel[(grid_n, grid_m, split)](
        x, *ptrs, bias if bias is not None else ptrs[4], target, m, n, k, x.stride(0),
        target.stride(-2), target.stride(0) if partial else 0, per_split, *strides,
        BM=bm, BN=bn, H=h, **type_constants(p), HAS_BIAS=bias is not None, PARTIAL=partial,
        GATE=-1 if gate is None else KINDS[gate],
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        USE_PDL=use_pdl, num_warps=warps, num_stages=stages, launch_pdl=use_pdl)
    if partial:
        y = target.sum(0)
        if bias is not None:
            y += bias.to(torch.float32)
        out.copy_(y)
    return out
