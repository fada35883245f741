"""Triton dequantization: a packed weight (or some of its rows) to a dense tensor.

Two uses: the embedding gathers the rows of the step's tokens, and large matmuls decode the
whole weight into a workspace in the activation dtype for cuBLAS. Compiled without fused
multiply-adds, the float32 values are the same bits as the torch reference (and so as
``gguf.quants.dequantize``); narrower outputs are those values rounded to nearest even.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tallow.kernels.jit import step_jit

from ..packing import PackedWeight
from .decode import combine, decode_parts, element_offsets, plane_args, type_constants

#: rows and 8-byte half-chunks per program
BLOCK_ROWS, BLOCK_HALVES = 16, 16


@step_jit(values=["n_rows"], pointers=["ids_ptr", "out_ptr"])
def _dequant_kernel(nib_ptr, pair_ptr, bit_ptr, byte_ptr, d_ptr, dm_ptr, sc_ptr, mn_ptr,
                    lut_ptr, ids_ptr, out_ptr, n_rows, n_halves, stride_out,
                    s_nib, s_pair, s_bit, s_byte, s_d, s_sc,
                    GATHER: tl.constexpr, BN: tl.constexpr, H: tl.constexpr,
                    NIB: tl.constexpr, PAIR: tl.constexpr, BIT: tl.constexpr,
                    BYTE: tl.constexpr, OFFSET: tl.constexpr, LUT: tl.constexpr,
                    GROUP: tl.constexpr, QBLOCK: tl.constexpr, SCALES: tl.constexpr,
                    MINS: tl.constexpr, BIT_SHIFT: tl.constexpr):
    offs = tl.program_id(0) * BN + tl.arange(0, BN)
    row_mask = offs < n_rows
    if GATHER:
        rows = tl.load(ids_ptr + offs, mask=row_mask, other=0)
    else:
        rows = offs
    halves = tl.program_id(1) * H + tl.arange(0, H)
    half_mask = halves < n_halves
    f_lo, f_hi, s_lo, s_hi, m_lo, m_hi = decode_parts(
        nib_ptr, pair_ptr, bit_ptr, byte_ptr, d_ptr, dm_ptr, sc_ptr, mn_ptr, lut_ptr,
        rows, row_mask, halves, half_mask, s_nib, s_pair, s_bit, s_byte, s_d, s_sc, BN, H,
        NIB, PAIR, BIT, BYTE, OFFSET, LUT, GROUP, QBLOCK, SCALES, MINS, BIT_SHIFT)
    w_lo = combine(f_lo, s_lo, m_lo, MINS)
    w_hi = combine(f_hi, s_hi, m_hi, MINS)
    out = (out_ptr + offs[:, None, None].to(tl.int64) * stride_out
           + element_offsets(halves, 1))
    mask = row_mask[:, None, None] & half_mask[None, :, None]
    tl.store(out, w_lo.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out + 16, w_hi.to(out_ptr.dtype.element_ty), mask=mask)


def dequantize_triton(p: PackedWeight, dtype: torch.dtype = torch.float32,
                      ids: torch.Tensor | None = None,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """``[rows, cols]`` in ``dtype`` (rows ``ids`` only, when given: ``[len(ids), cols]``).
    ``out`` (a ``[n, cols]`` tensor whose rows are contiguous) receives the values in place."""
    n = p.rows if ids is None else ids.numel()
    if out is None:
        out = torch.empty(n, p.cols, dtype=dtype, device=p.device)
    if out.shape != (n, p.cols) or out.stride(1) != 1:
        raise ValueError(f"dequantize: out must be [{n}, {p.cols}] with contiguous rows, got "
                         f"{tuple(out.shape)} with strides {out.stride()}")
    if n == 0:
        return out
    ptrs, strides = plane_args(p)
    ids_arg = ids.reshape(-1) if ids is not None else ptrs[4]
    n_halves = p.cols // 16
    grid = (triton.cdiv(n, BLOCK_ROWS), triton.cdiv(n_halves, BLOCK_HALVES))
    _dequant_kernel[grid](*ptrs, ids_arg, out, n, n_halves, out.stride(0), *strides,
                          GATHER=ids is not None, BN=BLOCK_ROWS, H=BLOCK_HALVES,
                          **type_constants(p), num_warps=4,
                          # separate multiplies and subtractions: ggml's exact values
                          enable_fp_fusion=False)
    return out
