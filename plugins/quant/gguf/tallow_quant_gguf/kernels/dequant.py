"""Triton dequantization: a packed weight (or some of its rows) to a dense tensor.

Two uses: the embedding gathers the rows of the step's tokens, and large matmuls decode the
whole weight into a workspace in the activation dtype for cuBLAS. A program decodes ``BN`` rows
by ``Q`` quads slot by slot (:mod:`~tallow_quant_gguf.kernels.decode`) and writes each slot's 4
consecutive elements per quad as one vector. Compiled without fused multiply-adds, the
float32 values are the same bits as the torch reference (and so as ``gguf.quants.dequantize``);
narrower outputs are those values rounded to nearest even.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tallow.kernels.jit import step_jit

from ..packing import PackedWeight
from .decode import (group_scales, load_codes, load_group_fields, plane_args, quads_per_chunk,
                     slot_columns, slot_weights, type_constants)

#: rows and quads (16 bytes of codes) per program
BLOCK_ROWS, BLOCK_QUADS = 8, 32


@step_jit(values=["n_rows"], pointers=["ids_ptr", "out_ptr"])
def _dequant_kernel(nib_ptr, pair_ptr, bit_ptr, byte_ptr, d_ptr, dm_ptr, sc_ptr, mn_ptr,
                    lut_ptr, ids_ptr, out_ptr, n_rows, n_quads, stride_out,
                    s_nib, s_pair, s_bit, s_byte, s_d, s_sc,
                    GATHER: tl.constexpr, BN: tl.constexpr, Q: tl.constexpr,
                    NIB: tl.constexpr, PAIR: tl.constexpr, BIT: tl.constexpr,
                    BYTE: tl.constexpr, OFFSET: tl.constexpr, LUT: tl.constexpr,
                    GROUP: tl.constexpr, QBLOCK: tl.constexpr, SCALES: tl.constexpr,
                    MINS: tl.constexpr):
    offs = tl.program_id(0) * BN + tl.arange(0, BN)
    row_mask = offs < n_rows
    if GATHER:
        rows = tl.load(ids_ptr + offs, mask=row_mask, other=0).to(tl.int64)
    else:
        rows = offs.to(tl.int64)
    quads = tl.program_id(1) * Q + tl.arange(0, Q)
    quad_mask = quads < n_quads
    r3 = rows[:, None, None]
    q3 = quads[None, :, None]
    u3 = tl.arange(0, 4)[None, None, :]
    mask3 = row_mask[:, None, None] & quad_mask[None, :, None] & (u3 < 4)
    nib, pair, bit, byte = load_codes(nib_ptr, pair_ptr, bit_ptr, byte_ptr, r3, q3, u3, mask3,
                                      s_nib, s_pair, s_bit, s_byte, NIB, PAIR, BIT, BYTE, True)
    mask2 = row_mask[:, None] & quad_mask[None, :]
    chunks2 = quads[None, :] // 2 if BYTE else quads[None, :]
    d, dm, sc0, sc1, mn = load_group_fields(d_ptr, dm_ptr, sc_ptr, mn_ptr, rows[:, None],
                                            chunks2, mask2, s_d, s_sc, GROUP, QBLOCK, SCALES,
                                            MINS, True)
    scale, low_min = group_scales(d, dm, sc0, mn, SCALES, MINS)
    scale1, low_min1 = group_scales(d, dm, sc1, mn, SCALES, MINS)
    out = out_ptr + offs[:, None, None].to(tl.int64) * stride_out
    SLOTS: tl.constexpr = 4 if BYTE else 8
    for s in tl.static_range(SLOTS):
        if s < SLOTS // 2:
            w = slot_weights(nib, pair, bit, byte, lut_ptr, scale, low_min, s, NIB, PAIR, BIT,
                             BYTE, OFFSET, LUT, MINS)
        else:
            w = slot_weights(nib, pair, bit, byte, lut_ptr, scale1, low_min1, s, NIB, PAIR,
                             BIT, BYTE, OFFSET, LUT, MINS)
        tl.store(out + slot_columns(q3, u3, s, BYTE), w.to(out_ptr.dtype.element_ty),
                 mask=mask3)


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
    n_quads = p.cols // 32 * quads_per_chunk(p)
    grid = (triton.cdiv(n, BLOCK_ROWS), triton.cdiv(n_quads, BLOCK_QUADS))
    _dequant_kernel[grid](*ptrs, ids_arg, out, n, n_quads, out.stride(0), *strides,
                          GATHER=ids is not None, BN=BLOCK_ROWS, Q=BLOCK_QUADS,
                          **type_constants(p), num_warps=4,
                          # separate multiplies and subtractions: ggml's exact values
                          enable_fp_fusion=False)
    return out
