"""The turbo KV format of tallow-kvcache-turboquant in Triton: writing it (rotation,
quantization and bit packing fused into the KV store) and reading code tiles for the prefill
and decode kernels.

The format (``tallow_kvcache_turboquant.codec`` and ``.quantize`` define it, with a torch
reference): a head vector ``x`` (a key less its head's offset ``m``, divided by its smoothing
``s``; a value less its offset ``m_v``) is rotated, ``y = x @ R.T``, and stored as ``BITS``-bit
codes with one float16 scale, read back as ``(code - c) * scale``, ``c = (2**BITS - 1) / 2``.
Packed, the code of coordinate ``d`` of a vector of ``D`` lies

- 8 bits: in byte ``d``;
- 4 bits: in byte ``d % (D/2)`` at bit ``4 * (d // (D/2))``;
- 3 bits: its low two bits in byte ``d % (D/4)`` at bit ``2 * (d // (D/4))``, its third bit in
  byte ``D/4 + d % (D/8)`` at bit ``d // (D/8)``.

Attention reads codes where they are: the query was rotated (and multiplied by ``s``) once
for the step, so a key tile is just ``code - c`` and its scales multiply the scores, column by
column; a value tile's scales multiply the softmax weights before the product, and the output
is rotated back once after the kernel. Nothing in the inner loops undoes the rotation.
"""

from __future__ import annotations

import triton
import triton.language as tl

from tallow.kernels import allow_next, step_jit, wait_prior


@triton.jit
def code_positions(offs_d, HEAD_DIM: tl.constexpr, BITS: tl.constexpr):
    """(byte, shift, high byte, high shift) [D_PAD] of each coordinate's code in a packed
    vector (the high pair is the third bit of 3-bit codes; unused otherwise)."""
    if BITS == 8:
        byte = offs_d
        shift = offs_d * 0
    elif BITS == 4:
        byte = offs_d % (HEAD_DIM // 2)
        shift = 4 * (offs_d // (HEAD_DIM // 2))
    else:
        byte = offs_d % (HEAD_DIM // 4)
        shift = 2 * (offs_d // (HEAD_DIM // 4))
    high_byte = HEAD_DIM // 4 + offs_d % (HEAD_DIM // 8)
    high_shift = offs_d // (HEAD_DIM // 8)
    return byte, shift, high_byte, high_shift


@triton.jit
def load_centered(
    codes_ptr,
    rows,
    mask,
    byte,
    shift,
    high_byte,
    high_shift,
    BITS: tl.constexpr,
    DTYPE: tl.constexpr,
):
    """``code - c`` [N, D_PAD] in ``DTYPE`` (exact: small integers and halves) of the packed
    vectors starting at byte offsets ``rows`` [N]; ``-c`` where ``mask`` [N, D_PAD] is false
    (code 0): the callers mask those tokens' scores, zero their weights and scales, and zero
    the query's coordinates past the head size, so no select per value is needed."""
    b = tl.load(codes_ptr + rows[:, None] + byte[None, :], mask=mask, other=0).to(tl.int32)
    if BITS == 8:
        code = b
    elif BITS == 4:
        code = (b >> shift[None, :]) & 15
    else:
        hb = tl.load(codes_ptr + rows[:, None] + high_byte[None, :], mask=mask, other=0).to(
            tl.int32
        )
        code = ((b >> shift[None, :]) & 3) | (((hb >> high_shift[None, :]) & 1) << 2)
    return (code.to(tl.float32) - ((1 << BITS) - 1) * 0.5).to(DTYPE)


#: The PTX nibble unpacking. fp16 bit patterns, two per 32-bit word: 1024.0, 7.5, 1/16, -71.5.
#: A nibble ``n`` or'ed into the low mantissa bits of 1024.0 reads as ``1024 + n``, and in bits
#: 4-7 as ``1024 + 16 n``; every subtraction and product is exact. ``lop3`` 0xEA is
#: ``(a & b) | c``.
_NIBBLE_PTX = tl.constexpr("""{
.reg .b32 z, t0, t1, magic, center, sixteenth, offset;
mov.b32 z, 0;
mov.b32 magic, 0x64006400;
mov.b32 center, 0x47804780;
mov.b32 sixteenth, 0x2C002C00;
mov.b32 offset, 0xD478D478;
prmt.b32 t0, $4, z, 0x4140;
prmt.b32 t1, $4, z, 0x4342;
lop3.b32 $0, t0, 0x000F000F, magic, 0xEA;
lop3.b32 $1, t1, 0x000F000F, magic, 0xEA;
sub.f16x2 $0, $0, magic;
sub.f16x2 $1, $1, magic;
sub.f16x2 $0, $0, center;
sub.f16x2 $1, $1, center;
lop3.b32 $2, t0, 0x00F000F0, magic, 0xEA;
lop3.b32 $3, t1, 0x00F000F0, magic, 0xEA;
fma.rn.f16x2 $2, $2, sixteenth, offset;
fma.rn.f16x2 $3, $3, sixteenth, offset;
}""")


@triton.jit
def unpack_nibbles(b, anchor, IN_PTX: tl.constexpr, DTYPE: tl.constexpr):
    """(low nibble - 7.5, high nibble - 7.5) of the bytes ``b`` (uint8), in ``DTYPE`` (exact).

    ``IN_PTX`` (fp16 only, not under the interpreter) does four bytes per inline-PTX call:
    each pair of bytes spread into the low bytes of two 16-bit halves (one ``prmt``), then per
    pair of values an and/or (one ``LOP3``) making the fp16 ``1024 + n`` (``1024 + 16 n`` for
    the high nibble), then two fp16x2 subtractions (1024, then 7.5: 1031.5 is no fp16) or, for
    the high nibble, one fma (``x / 16 - 71.5``): 12 instructions per 8 values, against a byte
    extraction, shift, mask, int-to-float conversion, subtraction and narrowing per value in
    registers. ``anchor``, an int32 tensor of ``b``'s shape that the PTX ignores, keeps Triton
    from moving the unpacking after the tile's staging for the tensor-core products (see
    :func:`.common.widen_fp8_in_ptx`); without it the sm_90 loop takes more instructions, not
    fewer (the staged bytes are read back one at a time)."""
    if IN_PTX:
        lo, hi = tl.inline_asm_elementwise(
            _NIBBLE_PTX,
            "=r,=r,=r,=r,r,r,r,r,r",
            [b, anchor],
            dtype=(tl.float16, tl.float16),
            is_pure=True,
            pack=4,
        )
    else:
        lo = ((b & 15).to(tl.float32) - 7.5).to(DTYPE)
        hi = ((b >> 4).to(tl.float32) - 7.5).to(DTYPE)
    return lo, hi


@triton.jit
def load_nibble_halves(
    codes_ptr,
    rows,
    offs_n,
    n_mask,
    offs_h,
    HALF: tl.constexpr,
    IN_PTX: tl.constexpr,
    DTYPE: tl.constexpr,
):
    """The centered 4-bit codes ``code - 7.5`` of the packed vectors at byte offsets ``rows``
    [N] (tokens ``offs_n``), as two tiles [N, H_PAD] (``offs_h`` = ``arange(H_PAD)``): coordinates ``[0, HALF)`` (low nibbles) and ``[HALF, D)``
    (high nibbles), ``HALF = D / 2``. Each row's ``HALF`` bytes are one contiguous run, read
    with 16-byte loads and each byte used for both of its codes. Rows outside ``n_mask`` and
    columns past ``HALF`` read byte 0 (codes -7.5): their scores and weights are masked or
    their query coordinates zero."""
    if HALF == offs_h.shape[0]:
        mask = n_mask[:, None]  # uniform along the row: keeps the loads 16 bytes wide
    else:
        mask = n_mask[:, None] & (offs_h < HALF)[None, :]
    b = tl.load(codes_ptr + rows[:, None] + offs_h[None, :], mask=mask, other=0)
    anchor = offs_n[:, None] + tl.zeros([offs_n.shape[0], offs_h.shape[0]], tl.int32)
    return unpack_nibbles(b, anchor, IN_PTX, DTYPE)


@triton.jit
def tile_scales(
    k_scales_ptr,
    v_scales_ptr,
    bt_row,
    start,
    seq_len,
    window_lo,
    active,
    kv_head,
    stride_sb,
    stride_so,
    USE_WINDOW: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    TILE_N: tl.constexpr,
):
    """(key scales, value scales) [TILE_N] fp32 of the tile of tokens from ``start`` of one
    KV head; 0 for tokens outside the context (or the window) and everywhere unless
    ``active``."""
    offs_n = start + tl.arange(0, TILE_N)
    n_mask = (offs_n < seq_len) & active
    if USE_WINDOW:
        n_mask = n_mask & (offs_n >= window_lo)
    blk = tl.load(bt_row + offs_n // BLOCK_SIZE, mask=n_mask, other=0).to(tl.int64)
    off = blk * stride_sb + (offs_n % BLOCK_SIZE) * stride_so + kv_head
    return (
        tl.load(k_scales_ptr + off, mask=n_mask, other=0.0).to(tl.float32),
        tl.load(v_scales_ptr + off, mask=n_mask, other=0.0).to(tl.float32),
    )


@triton.jit
def _unrotated_chunk(
    src_ptr,
    src_rows,
    offset_ptr,
    smooth_ptr,
    offs_k,
    heads,
    h_mask,
    HAS_OFFSET: tl.constexpr,
    HAS_SMOOTH: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """Input coordinates ``offs_k`` [H_PAD, K_CHUNK] (fp32) of the vectors at ``src_ptr +
    src_rows`` less their offset and divided by their smoothing (0 outside the vectors)."""
    k_mask = offs_k < HEAD_DIM
    mask = h_mask[:, None] & k_mask[None, :]
    x = tl.load(src_ptr + src_rows[:, None] + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
    per_head = heads[:, None] * HEAD_DIM + offs_k[None, :]
    if HAS_OFFSET:
        x = x - tl.load(offset_ptr + per_head, mask=mask, other=0.0)
    if HAS_SMOOTH:
        x = tl.math.div_rn(x, tl.load(smooth_ptr + per_head, mask=mask, other=1.0))
    return x


@triton.jit
def _stored_sumsq(
    src_ptr,
    src_rows,
    offset_ptr,
    smooth_ptr,
    heads,
    h_mask,
    HAS_OFFSET: tl.constexpr,
    HAS_SMOOTH: tl.constexpr,
    H_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    K_CHUNK: tl.constexpr,
):
    """Squared norms [H_PAD] of the vectors at ``src_ptr + src_rows`` less their offset and
    divided by their smoothing: those of their stored (rotated) form, the rotation being
    orthogonal (equal up to float32 rounding, as two summation orders are)."""
    sumsq = tl.zeros([H_PAD], tl.float32)
    for k0 in range(0, D_PAD, K_CHUNK):
        x = _unrotated_chunk(
            src_ptr,
            src_rows,
            offset_ptr,
            smooth_ptr,
            k0 + tl.arange(0, K_CHUNK),
            heads,
            h_mask,
            HAS_OFFSET,
            HAS_SMOOTH,
            HEAD_DIM,
        )
        sumsq += tl.sum(x * x, 1)
    return sumsq


@triton.jit
def _stored_segment(
    src_ptr,
    src_rows,
    offset_ptr,
    smooth_ptr,
    rot_ptr,
    seg: tl.constexpr,
    heads,
    h_mask,
    HAS_OFFSET: tl.constexpr,
    HAS_SMOOTH: tl.constexpr,
    H_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    K_CHUNK: tl.constexpr,
    SEG_W: tl.constexpr,
    SEG_PAD: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Coordinates ``[seg * SEG_W, (seg + 1) * SEG_W)`` [H_PAD, SEG_PAD] (fp32) of the stored
    form of the vectors at ``src_ptr + src_rows``: less their offset, divided by their
    smoothing, rotated (``@ R.T``) — that block of rows of ``R`` only, so each segment's codes
    come out in the packing's order with no shuffling of registers. The product runs over
    ``K_CHUNK`` input coordinates at a time, each chunk read from memory, so neither the
    vectors nor ``R`` is held whole in registers. Deterministic: computing a segment again
    gives the same bits."""
    offs_i = tl.arange(0, SEG_PAD)
    i_mask = offs_i < SEG_W
    y = tl.zeros([H_PAD, SEG_PAD], tl.float32)
    for k0 in range(0, D_PAD, K_CHUNK):
        offs_k = k0 + tl.arange(0, K_CHUNK)
        k_mask = offs_k < HEAD_DIM
        x = _unrotated_chunk(
            src_ptr,
            src_rows,
            offset_ptr,
            smooth_ptr,
            offs_k,
            heads,
            h_mask,
            HAS_OFFSET,
            HAS_SMOOTH,
            HEAD_DIM,
        )
        rt = tl.load(
            rot_ptr + (seg * SEG_W + offs_i)[None, :] * HEAD_DIM + offs_k[:, None],
            mask=k_mask[:, None] & i_mask[None, :],
            other=0.0,
        )
        y += tl.dot(x, rt, input_precision=PRECISION)
    return y


@triton.jit
def _encode_rows(
    src_ptr,
    src_rows,
    offset_ptr,
    smooth_ptr,
    rot_ptr,
    codes_ptr,
    scales_ptr,
    code_rows,
    scale_rows,
    heads,
    h_mask,
    HAS_OFFSET: tl.constexpr,
    HAS_SMOOTH: tl.constexpr,
    H_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    D_PAD: tl.constexpr,
    K_CHUNK: tl.constexpr,
    BITS: tl.constexpr,
    SEGMENTS: tl.constexpr,
    SEG_W: tl.constexpr,
    SEG_PAD: tl.constexpr,
    RMS_STEP: tl.constexpr,
    PRECISION: tl.constexpr,
):
    """Transform, quantize and pack the vectors at ``src_ptr + src_rows`` (one per head),
    writing the codes at byte offsets ``code_rows`` and the scales at ``scale_rows`` (rows
    outside ``h_mask`` are not written)."""
    center = ((1 << BITS) - 1) * 0.5
    # the scale first, from every coordinate of the rotated vector
    if RMS_STEP > 0:
        # the rotation keeps the norm: the rms of the vector before it, with no product
        sumsq = _stored_sumsq(
            src_ptr,
            src_rows,
            offset_ptr,
            smooth_ptr,
            heads,
            h_mask,
            HAS_OFFSET,
            HAS_SMOOTH,
            H_PAD,
            HEAD_DIM,
            D_PAD,
            K_CHUNK,
        )
        scale = RMS_STEP * tl.sqrt_rn(sumsq / HEAD_DIM)
    else:
        amax = tl.zeros([H_PAD], tl.float32)
        for seg in tl.static_range(SEGMENTS):
            y = _stored_segment(
                src_ptr,
                src_rows,
                offset_ptr,
                smooth_ptr,
                rot_ptr,
                seg,
                heads,
                h_mask,
                HAS_OFFSET,
                HAS_SMOOTH,
                H_PAD,
                HEAD_DIM,
                D_PAD,
                K_CHUNK,
                SEG_W,
                SEG_PAD,
                PRECISION,
            )
            amax = tl.maximum(amax, tl.max(tl.abs(y), 1))
        scale = amax / center
    scale = scale.to(tl.float16)
    tl.store(scales_ptr + scale_rows, scale, mask=h_mask)
    s = scale.to(tl.float32)[:, None]
    safe = tl.where(s > 0.0, s, 1.0)
    offs_i = tl.arange(0, SEG_PAD)
    # then the codes, segment by segment, packed as the layout says
    plane0 = tl.zeros([H_PAD, SEG_PAD], tl.int32)
    plane1 = tl.zeros([H_PAD, SEG_PAD], tl.int32)
    high = tl.zeros([H_PAD, SEG_PAD], tl.int32)
    for seg in tl.static_range(SEGMENTS):
        y = _stored_segment(
            src_ptr,
            src_rows,
            offset_ptr,
            smooth_ptr,
            rot_ptr,
            seg,
            heads,
            h_mask,
            HAS_OFFSET,
            HAS_SMOOTH,
            H_PAD,
            HEAD_DIM,
            D_PAD,
            K_CHUNK,
            SEG_W,
            SEG_PAD,
            PRECISION,
        )
        q = tl.where(s > 0.0, tl.math.div_rn(y, safe), 0.0)
        code = tl.minimum(tl.maximum(tl.floor(q + (center + 0.5)), 0.0), (1 << BITS) - 1).to(
            tl.int32
        )
        if BITS == 8:
            plane0 = code
        elif BITS == 4:
            plane0 = plane0 | (code << (4 * seg))
        else:
            if seg % 2 == 0:
                plane0 = plane0 | ((code & 3) << (2 * (seg // 2)))
            else:
                plane1 = plane1 | ((code & 3) << (2 * (seg // 2)))
            high = high | (((code >> 2) & 1) << seg)
    mask = h_mask[:, None] & (offs_i < SEG_W)[None, :]
    dst = codes_ptr + code_rows[:, None] + offs_i[None, :]
    tl.store(dst, plane0.to(tl.uint8), mask=mask)
    if BITS == 3:
        tl.store(dst + SEG_W, plane1.to(tl.uint8), mask=mask)
        tl.store(dst + 2 * SEG_W, high.to(tl.uint8), mask=mask)


# The slot mapping is a slice of a packed per-step buffer: its alignment varies.
@step_jit(pointers=["slot_ptr"])
def store_turbo_kernel(
    k_ptr,
    v_ptr,
    slot_ptr,
    k_codes_ptr,
    k_scales_ptr,
    v_codes_ptr,
    v_scales_ptr,
    k_offset_ptr,
    k_smooth_ptr,
    v_offset_ptr,
    rot_ptr,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_cb,
    stride_co,
    stride_ch,
    stride_sb,
    stride_so,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    H_PAD: tl.constexpr,
    D_PAD: tl.constexpr,
    K_CHUNK: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BITS: tl.constexpr,
    SEGMENTS: tl.constexpr,
    SEG_W: tl.constexpr,
    SEG_PAD: tl.constexpr,
    RMS_STEP: tl.constexpr,
    HAS_K_OFFSET: tl.constexpr,
    HAS_K_SMOOTH: tl.constexpr,
    HAS_V_OFFSET: tl.constexpr,
    PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """Grid (tokens,): token ``t``'s K and V, all heads, into the turbo cache at ``slot[t]``
    (block ``slot // BLOCK_SIZE``, offset ``slot % BLOCK_SIZE``); slot < 0 skips it. Codes are
    ``[blocks, bs, Hkv, CODE_BYTES]`` (strides ``stride_c*``), scales ``[blocks, bs, Hkv]``
    (strides ``stride_sb``, ``stride_so``, 1); offsets and smoothing ``[Hkv, D]`` and the
    rotation ``[D, D]`` contiguous."""
    wait_prior(USE_PDL)  # slots, K and V are earlier kernels' output
    allow_next(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    blk = slot // BLOCK_SIZE
    off = slot % BLOCK_SIZE
    heads = tl.arange(0, H_PAD)
    h_mask = heads < NUM_KV_HEADS
    code_rows = blk * stride_cb + off * stride_co + heads.to(tl.int64) * stride_ch
    scale_rows = blk * stride_sb + off * stride_so + heads
    _encode_rows(
        k_ptr,
        t * stride_kt + heads.to(tl.int64) * stride_kh,
        k_offset_ptr,
        k_smooth_ptr,
        rot_ptr,
        k_codes_ptr,
        k_scales_ptr,
        code_rows,
        scale_rows,
        heads,
        h_mask,
        HAS_K_OFFSET,
        HAS_K_SMOOTH,
        H_PAD,
        HEAD_DIM,
        D_PAD,
        K_CHUNK,
        BITS,
        SEGMENTS,
        SEG_W,
        SEG_PAD,
        RMS_STEP,
        PRECISION,
    )
    _encode_rows(
        v_ptr,
        t * stride_vt + heads.to(tl.int64) * stride_vh,
        v_offset_ptr,
        v_offset_ptr,
        rot_ptr,
        v_codes_ptr,
        v_scales_ptr,
        code_rows,
        scale_rows,
        heads,
        h_mask,
        HAS_V_OFFSET,
        False,
        H_PAD,
        HEAD_DIM,
        D_PAD,
        K_CHUNK,
        BITS,
        SEGMENTS,
        SEG_W,
        SEG_PAD,
        RMS_STEP,
        PRECISION,
    )
