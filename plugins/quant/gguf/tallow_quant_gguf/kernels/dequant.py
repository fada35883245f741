"""Triton dequantization: a packed weight (or some of its rows) to a dense tensor.

Two uses: the embedding gathers the rows of the step's tokens, and large matmuls decode the
whole weight into a workspace in the activation dtype for cuBLAS. The second is a stream: it
reads 4.5 bits and writes 16 per weight (Q4_K to bf16), so the kernel is written to store at
copy speed:

- The unit of work is a *piece*: 8 consecutive elements of a row, a quarter of a 32-element
  chunk. A thread decodes whole pieces and writes each as one 16-byte vector (two for float32
  output), and consecutive threads own consecutive pieces of a row, so a warp writes 512
  contiguous bytes per store: whole sectors, never a partial one that the memory would have to
  merge.
- A piece of a 4-bit (or narrower) type is slots ``2p`` and ``2p + 1`` of its chunk (see
  :mod:`~tallow_quant_gguf.packing`): both come from the chunk's 4 code words, which the thread
  loads as one 16-byte vector (the 4 threads of a chunk share it through the L1 cache). A
  piece of 8-bit codes is byte ``p`` of the chunk's 8 words. The two halves are decoded side by
  side (``[.., 4]`` each) and joined in registers.
- Codes become float32 without a conversion instruction: OR-ed into the mantissa of 2^23 (one
  three-input logic instruction with the mask), the word read as a float is ``2^23 + q``, and
  one exact subtraction gives ``q - offset``.
- A program owns a column block and walks row blocks (``BN`` rows at a time, the grid's
  programs interleaved), so the column offsets, shifts and masks are computed once per program.

Compiled without fused multiply-adds, the float32 values are the same bits as the torch
reference (and so as ``gguf.quants.dequantize``): ``d * sc``, ``* f(q)``, ``- dm * mn`` in
ggml's order. Narrower outputs are those values rounded to nearest even.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tallow.kernels import interpreting, step_jit

from ..packing import PackedWeight
from .decode import plane_args, type_constants
from .gemv import _as_float, bit_constants

#: rows per step, chunks (32 elements) per program and warps of the kernel
BLOCK_ROWS, BLOCK_CHUNKS, WARPS = 16, 8, 4
#: row blocks each program walks, at most: the grid's first axis is the row blocks divided by it
ROW_STEPS = 8
#: 2^23 as float32 bits: OR-ed with a code below 2^23, the float is exactly 2^23 + q
_MAGIC_23 = tl.constexpr(0x4B000000)


def bits_mode(p: PackedWeight) -> bool:
    """Whether ``p``'s codes are decoded by exponent bits straight from their words (4-bit codes
    alone, or 8-bit codes): else they are assembled from their planes first."""
    qt = p.qtype
    return qt.byte or (qt.nib and not (qt.pair or qt.bit or qt.lut))


@triton.jit
def _load(ptr, mask, MASKED: tl.constexpr):
    if MASKED:
        v = tl.load(ptr, mask=mask, other=0)
    else:
        v = tl.load(ptr)
    return v


@triton.jit
def _byte_to_bits_15(w, k, PTX: tl.constexpr):
    """``w`` rotated right by ``k`` (a per-piece ``8p + 17 mod 32``): its byte ``p`` lands in
    bits 15..22. On a GPU one funnel shift (``PTX``; LLVM does not find it in the shifts),
    under the interpreter the two shifts."""
    if PTX:
        t = tl.inline_asm_elementwise(
            "shf.r.wrap.b32 $0, $1, $1, $2;", "=r,r,r", [w, k], dtype=tl.int32, is_pure=True, pack=1
        )
    else:
        v = w.to(tl.uint32, bitcast=True)
        t = ((v >> k) | (v << ((32 - k) & 31))).to(tl.int32, bitcast=True)
    return t


@triton.jit
def _plane_codes(
    nib_ptr,
    pair_ptr,
    bit_ptr,
    off_nib,
    off_pair,
    off_bit,
    mask,
    s,
    NIB: tl.constexpr,
    PAIR: tl.constexpr,
    BIT: tl.constexpr,
    MASKED: tl.constexpr,
):
    """Integer codes of slot ``s`` (a per-piece tensor) assembled from the code planes."""
    if NIB:
        q = (_load(nib_ptr + off_nib, mask, MASKED) >> (4 * s)) & 15
        if PAIR:
            pair = _load(pair_ptr + off_pair, mask, MASKED).to(tl.int32)
            q = q | (((pair >> (2 * s)) & 3) << 4)
    else:
        pair = _load(pair_ptr + off_pair, mask, MASKED).to(tl.int32)
        q = (pair >> (2 * s)) & 3
    if BIT:
        bit = _load(bit_ptr + off_bit, mask, MASKED).to(tl.int32)
        q = q | (((bit >> s) & 1) << (4 if NIB else 2))
    return q


@triton.jit
def _code_values(q, lut_ptr, OFFSET: tl.constexpr, LUT: tl.constexpr):
    """``f(q)`` in float32: the IQ4 table's value, or ``q - OFFSET`` from the bits of
    ``2^23 + q`` (one exact subtraction)."""
    if LUT:
        f = tl.load(lut_ptr + q)
    else:
        f = (q | _MAGIC_23).to(tl.float32, bitcast=True) - (8388608.0 + OFFSET)
    return f


@triton.jit
def _piece_scales(
    d_ptr,
    dm_ptr,
    sc_ptr,
    mn_ptr,
    off_d,
    off_sc,
    mask,
    SCALES: tl.constexpr,
    MINS: tl.constexpr,
    MASKED: tl.constexpr,
):
    """Scale and min (float32, ``[BN, J]``) of each piece's group: ``d * sc`` and ``dm * mn``
    as ggml forms them (the min is meaningless when the type has none)."""
    d = _load(d_ptr + off_d, mask, MASKED).to(tl.float32)
    scale = d
    low_min = d
    if SCALES == 1:
        scale = d * _load(sc_ptr + off_sc, mask, MASKED).to(tl.float32)
    if SCALES == 2:  # Q2_K: a byte per 16 elements, low nibble the scale, high nibble the min
        packed = _load(sc_ptr + off_sc, mask, MASKED).to(tl.int32)
        scale = d * (packed & 15).to(tl.float32)
    if MINS != 0:
        low_min = _load(dm_ptr + off_d, mask, MASKED).to(tl.float32)
        if MINS == 2:
            low_min = low_min * _load(mn_ptr + off_sc, mask, MASKED).to(tl.float32)
        if MINS == 3:
            low_min = low_min * (packed >> 4).to(tl.float32)
    return scale, low_min


@triton.jit
def _scaled(f, scale, low_min, MINS: tl.constexpr):
    w = scale[:, :, None] * f
    if MINS != 0:
        w = w - low_min[:, :, None]
    return w


@step_jit(values=["n_rows"], pointers=["ids_ptr", "out_ptr"])
def _dequant_kernel(
    nib_ptr,
    pair_ptr,
    bit_ptr,
    byte_ptr,
    d_ptr,
    dm_ptr,
    sc_ptr,
    mn_ptr,
    lut_ptr,
    ids_ptr,
    out_ptr,
    n_rows,
    n_chunks,
    stride_out,
    s_nib,
    s_pair,
    s_bit,
    s_byte,
    s_d,
    s_sc,
    mask_lo,
    mask_hi,
    magic_lo,
    magic_hi,
    GATHER: tl.constexpr,
    BN: tl.constexpr,
    C: tl.constexpr,
    EVEN: tl.constexpr,
    BITS: tl.constexpr,
    PTX: tl.constexpr,
    NIB: tl.constexpr,
    PAIR: tl.constexpr,
    BIT: tl.constexpr,
    BYTE: tl.constexpr,
    OFFSET: tl.constexpr,
    LUT: tl.constexpr,
    GROUP: tl.constexpr,
    QBLOCK: tl.constexpr,
    SCALES: tl.constexpr,
    MINS: tl.constexpr,
):
    # Everything that depends only on the column block is computed once: per piece (``J`` of
    # them per tile row) its chunk, part, group, block and code words; per tile row ``i`` and
    # plane, the offset of row ``i`` of the block. A step adds the block's first row.
    J: tl.constexpr = 4 * C
    piece = tl.program_id(1) * J + tl.arange(0, J)
    chunk = piece >> 2
    part = piece & 3
    if GROUP == 16:
        grp = (2 * chunk + (part >> 1))[None, :]
    else:
        grp = chunk[None, :]
    blk = (chunk // (QBLOCK // 32))[None, :]
    u = tl.arange(0, 4)[None, None, :]
    # the chunk's 8 words of 8-bit codes (the piece is byte `part` of each), or its 4 words of
    # narrower ones (the piece is slots 2 * part and 2 * part + 1)
    words = ((8 if BYTE else 4) * chunk)[None, :, None] + u
    part3 = part[None, :, None]
    rot = (8 * part3 + 17) & 31  # byte `part` of a word to bits 15..22
    cols = (8 * piece)[None, :, None] + tl.arange(0, 8)[None, None, :]
    col_ok = (chunk < n_chunks)[None, :]
    local = tl.arange(0, BN)
    if GATHER:
        i1 = local[:, None] * 0
    else:
        i1 = local[:, None]
    i3 = i1[:, :, None]
    off_code = i3 * (s_byte if BYTE else s_nib) + words
    off_pair = i3 * s_pair + words
    off_bit = i3 * s_bit + words
    off_d = i1 * s_d + blk
    off_sc = i1 * s_sc + grp
    off_out = local[:, None, None] * stride_out + cols  # the output's rows are the tile's
    n_blocks = tl.cdiv(n_rows, BN)
    for rb in range(tl.program_id(0), n_blocks, tl.num_programs(0)):
        row_ok = rb * BN + local < n_rows
        if GATHER:  # each row its own: offsets from the rows the ids name
            rows = _load(ids_ptr + rb * BN + local, row_ok, not EVEN).to(tl.int64)
            base1 = rows[:, None]
            base3 = rows[:, None, None]
        else:  # the block's first row; its rows are the tile's
            base1 = tl.cast(rb * BN, tl.int64)
            base3 = base1
        mask2 = row_ok[:, None] & col_ok
        mask3 = mask2[:, :, None]
        scale, low_min = _piece_scales(
            d_ptr + base1 * s_d,
            dm_ptr + base1 * s_d,
            sc_ptr + base1 * s_sc,
            mn_ptr + base1 * s_sc,
            off_d,
            off_sc,
            mask2,
            SCALES,
            MINS,
            not EVEN,
        )
        if BITS and BYTE:  # each half of the piece: byte `part` of 4 of the chunk's words
            code_ptr = byte_ptr + base3 * s_byte
            codes0 = _load(code_ptr + off_code, mask3, not EVEN)
            codes1 = _load(code_ptr + (off_code + 4), mask3, not EVEN)
            t0 = _byte_to_bits_15(codes0, rot, PTX)
            t1 = _byte_to_bits_15(codes1, rot, PTX)
            f0 = _as_float(t0, mask_lo, magic_lo) - (256.0 + OFFSET)
            f1 = _as_float(t1, mask_lo, magic_lo) - (256.0 + OFFSET)
        elif BITS:  # slot 2p in bits 15..18 (256 + q), slot 2p + 1 in bits 19..22 (16 + q)
            codes = _load(nib_ptr + base3 * s_nib + off_code, mask3, not EVEN)
            t = _byte_to_bits_15(codes, rot, PTX)
            f0 = _as_float(t, mask_lo, magic_lo) - (256.0 + OFFSET)
            f1 = _as_float(t, mask_hi, magic_hi) - (16.0 + OFFSET)
        else:
            slot = 2 * part3
            q0 = _plane_codes(
                nib_ptr + base3 * s_nib,
                pair_ptr + base3 * s_pair,
                bit_ptr + base3 * s_bit,
                off_code,
                off_pair,
                off_bit,
                mask3,
                slot,
                NIB,
                PAIR,
                BIT,
                not EVEN,
            )
            q1 = _plane_codes(
                nib_ptr + base3 * s_nib,
                pair_ptr + base3 * s_pair,
                bit_ptr + base3 * s_bit,
                off_code,
                off_pair,
                off_bit,
                mask3,
                slot + 1,
                NIB,
                PAIR,
                BIT,
                not EVEN,
            )
            f0 = _code_values(q0, lut_ptr, OFFSET, LUT)
            f1 = _code_values(q1, lut_ptr, OFFSET, LUT)
        w0 = _scaled(f0, scale, low_min, MINS)
        w1 = _scaled(f1, scale, low_min, MINS)
        # [BN, J, 4] twice -> [BN, J, 8]: in registers, each thread's 8 elements in order
        w = tl.reshape(tl.permute(tl.join(w0, w1), (0, 1, 3, 2)), (BN, J, 8))
        out = out_ptr + tl.cast(rb * BN, tl.int64) * stride_out + off_out
        if EVEN:
            tl.store(out, w.to(out_ptr.dtype.element_ty))
        else:
            tl.store(out, w.to(out_ptr.dtype.element_ty), mask=mask3)


def dequantize_triton(
    p: PackedWeight,
    dtype: torch.dtype = torch.float32,
    ids: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[rows, cols]`` in ``dtype`` (rows ``ids`` only, when given: ``[len(ids), cols]``).
    ``out`` (a ``[n, cols]`` tensor whose rows are contiguous) receives the values in place."""
    n = p.rows if ids is None else ids.numel()
    if out is None:
        out = torch.empty(n, p.cols, dtype=dtype, device=p.device)
    if out.shape != (n, p.cols) or out.stride(1) != 1:
        raise ValueError(
            f"dequantize: out must be [{n}, {p.cols}] with contiguous rows, got "
            f"{tuple(out.shape)} with strides {out.stride()}"
        )
    if n == 0:
        return out
    ptrs, strides = plane_args(p)
    ids_arg = ids.reshape(-1) if ids is not None else ptrs[4]
    n_chunks = p.cols // 32
    row_blocks = triton.cdiv(n, BLOCK_ROWS)
    grid = (triton.cdiv(row_blocks, ROW_STEPS), triton.cdiv(n_chunks, BLOCK_CHUNKS))
    _dequant_kernel[grid](
        *ptrs,
        ids_arg,
        out,
        n,
        n_chunks,
        out.stride(0),
        *strides,
        GATHER=ids is not None,
        BN=BLOCK_ROWS,
        C=BLOCK_CHUNKS,
        *bit_constants(p.qtype.byte),
        EVEN=n % BLOCK_ROWS == 0 and n_chunks % BLOCK_CHUNKS == 0,
        BITS=bits_mode(p),
        PTX=not interpreting(),
        **type_constants(p),
        num_warps=WARPS,
        # separate multiplies and subtractions: ggml's exact values
        enable_fp_fusion=False,
    )
    return out
