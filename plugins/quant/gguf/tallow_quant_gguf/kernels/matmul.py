"""The tensor-core quantized matmul: ``y = x @ W.T (+ b)`` decoding ``W`` tile by tile in
registers, for any number of rows of x.

A program owns ``BN`` output features (the weight rows) and ``BM`` rows of x, and walks K ``Q``
quads at a time (:mod:`~tallow_quant_gguf.kernels.decode`). Each step decodes its weight tile
slot by slot in the threads that loaded the codes, puts the slots back in column order (joins
and a permutation of in-thread dimensions: no data moves) and multiplies the tile with the
activations of its columns: ``acc [BN, BM] += W [BN, K step] @ x.T [K step, BM]``. The weight
is the left operand, so M, even 1, only pads the narrow right side (Hopper's ``wgmma`` needs
64 rows on the left).

Three ways to decode (``DECODE``, the tuned configuration's last field):

- ``0``, any type: ``scale * f(q) - min`` in float32, rounded to the product dtype (x's dtype;
  float32 activations multiply in float32, exactly).
- ``1``, fp16 pairs (4-bit codes alone: Q4_0, Q4_1, Q4_K; 8-bit codes: Q8_0) straight from the
  code bits, in inline PTX: a byte permute puts one code byte of two neighbouring words into
  the two halves of a register, a mask-and-or turns a 4-bit (or 8-bit) field into the fp16
  ``1024 + q``, and fused multiply-adds on both halves at once give ``sc * q`` exactly, then
  ``d * (sc * q) - min`` rounded once to fp16 (11 significant bits, finer than the bf16 weights
  of the workspace path): about 1.75 instructions per weight. The activations are rounded to
  fp16 as they are read (exact for bf16 values of magnitude 6.1e-5 to 65504; larger ones are
  clamped to 65504, smaller ones keep fp16's subnormal steps) — cheap when x is a few rows.
- ``2``, float32 from exponent bits (the same types): as in the one-row GEMV
  (:mod:`~tallow_quant_gguf.kernels.gemv`), a shifted code field or'ed into the bits of 256.0
  (16.0) *is* ``256 + q`` (``16 + q``); one fused multiply-add ``v * scale + c`` gives the
  weight, rounded to x's dtype: about 3 instructions per weight and x is used as it is — the
  better trade when x is many rows.

Split-K (``n_split > 1``): the programs of one output tile each take a slice of K and the last
one adds the slices (:mod:`~tallow_quant_gguf.kernels.splitk`). The activation of a gated MLP
can be applied as x is read (``GATE``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from tallow.kernels import (
    ACTIVATION_KINDS as KINDS,
    allow_next,
    gated_value,
    interpreting,
    pdl_enabled,
    step_jit,
    wait_prior,
)

from ..packing import PackedWeight
from .decode import (
    group_scales,
    load_code_tile,
    load_group_fields,
    plane_args,
    quad_range,
    quads_per_chunk,
    slot_weights,
    type_constants,
)
from .gemv import _as_float, _byte_to_bits_15, bit_constants, check_offsets
from .splitk import counters, finish_tile, split_chunks, workspace

#: fp16 decoding of 4-bit codes. Inputs: two neighbouring code words ($8, $9), and as fp16
#: pairs the sub-scale ``a`` ($10), the scale ``d`` ($11) and the additive term ``c`` ($12);
#: outputs: slots 0..7 of both words as fp16 pairs, ``d * (a * q) + c``. Byte p of each word
#: holds slots 2p (low nibble) and 2p+1: ``(1024 + q) * a - 1024 a`` and
#: ``(1024 + 16 q) * a/16 - 64 a`` are ``a * q`` exactly (a * q < 2048).
_NIB_FP16 = tl.constexpr(
    "{\n.reg .b32 t, lo, hi, na, a16, na16, k;\n"
    "mov.b32 k, 0xE400E400;\nmul.rn.f16x2 na, $10, k;\n"
    "mov.b32 k, 0x2C002C00;\nmul.rn.f16x2 a16, $10, k;\n"
    "mov.b32 k, 0xD400D400;\nmul.rn.f16x2 na16, $10, k;\n"
    + "".join(
        f"prmt.b32 t, $8, $9, 0x{4 + p}{4 + p}{p}{p};\n"
        "lop3.b32 lo, t, 0x000F000F, 0x64006400, 0xEA;\n"
        "lop3.b32 hi, t, 0x00F000F0, 0x64006400, 0xEA;\n"
        "fma.rn.f16x2 lo, lo, $10, na;\n"
        "fma.rn.f16x2 hi, hi, a16, na16;\n"
        f"fma.rn.f16x2 ${2 * p}, lo, $11, $12;\n"
        f"fma.rn.f16x2 ${2 * p + 1}, hi, $11, $12;\n"
        for p in range(4)
    )
    + "}"
)
_NIB_CONSTRAINTS = tl.constexpr("=r," * 8 + "r,r,r,r,r")

#: fp16 decoding of 8-bit codes stored as q + 128. Inputs: two neighbouring code words ($4,
#: $5) and the scale ``d`` as an fp16 pair ($6); outputs: slots 0..3 (byte p of each word) as
#: fp16 pairs ``d * q``: ``1024 + (q + 128) - 1152`` is q exactly.
_BYTE_FP16 = tl.constexpr(
    "{\n.reg .b32 t, v, off;\nmov.b32 off, 0xE480E480;\n"
    + "".join(
        f"prmt.b32 t, $4, $5, 0x{4 + p}{4 + p}{p}{p};\n"
        "lop3.b32 v, t, 0x00FF00FF, 0x64006400, 0xEA;\n"
        "add.rn.f16x2 v, v, off;\n"
        f"mul.rn.f16x2 ${p}, v, $6;\n"
        for p in range(4)
    )
    + "}"
)
_BYTE_CONSTRAINTS = tl.constexpr("=r," * 4 + "r,r,r")


@triton.jit
def _load_x(xb, xmask, K, GATE: tl.constexpr, DT: tl.constexpr, F16: tl.constexpr):
    """Activations at ``xb`` (a ``[BM, columns]`` pointer tile) in the product dtype ``DT``; with a
    gate, the row is ``[gate | up]`` and the value ``act(gate) * up`` as the activation kernel
    rounds it. ``F16``: clamped to fp16's range first."""
    x = tl.load(xb, mask=xmask, other=0.0)
    if GATE >= 0:
        x = gated_value(x, tl.load(xb + K, mask=xmask, other=0.0), GATE, xb.dtype.element_ty)
    if F16:
        x = tl.clamp(x.to(tl.float32), -65504.0, 65504.0)
    return x.to(DT)


@triton.jit
def _scale_fields(
    d_ptr,
    dm_ptr,
    sc_ptr,
    mn_ptr,
    r2,
    row_mask,
    q0,
    qs,
    q_end,
    s_d,
    s_sc,
    BYTE: tl.constexpr,
    GROUP: tl.constexpr,
    QBLOCK: tl.constexpr,
    SCALES: tl.constexpr,
    MINS: tl.constexpr,
    EVEN: tl.constexpr,
):
    """The scale fields of quads ``q0 + qs`` (nothing is read past ``q_end``)."""
    quads = q0 + qs
    if EVEN:
        mask2 = q0 < q_end
    else:
        mask2 = row_mask[:, None] & (quads < q_end)[None, :]
    chunks = quads // 2 if BYTE else quads
    return load_group_fields(
        d_ptr,
        dm_ptr,
        sc_ptr,
        mn_ptr,
        r2,
        chunks[None, :],
        mask2,
        s_d,
        s_sc,
        GROUP,
        QBLOCK,
        SCALES,
        MINS,
        not EVEN,
    )


@triton.jit
def _nibble_bits(
    nib, P: tl.constexpr, scale, c_lo, c_hi, mask_lo, mask_hi, magic_lo, magic_hi, DT: tl.constexpr
):
    """Slots ``2P`` and ``2P + 1`` (the nibbles of byte P of every word) as ``v * scale + c``
    rounded to ``DT``, v read from the code bits as ``256 + q`` and ``16 + q``."""
    t = _byte_to_bits_15(nib, P)
    return (
        (_as_float(t, mask_lo, magic_lo) * scale + c_lo).to(DT),
        (_as_float(t, mask_hi, magic_hi) * scale + c_hi).to(DT),
    )


@triton.jit
def _generic2(
    nib,
    pair,
    bit,
    byte,
    lut_ptr,
    scale,
    low_min,
    scale1,
    low_min1,
    S: tl.constexpr,
    NIB: tl.constexpr,
    PAIR: tl.constexpr,
    BIT: tl.constexpr,
    BYTE: tl.constexpr,
    OFFSET: tl.constexpr,
    LUT: tl.constexpr,
    MINS: tl.constexpr,
    DT: tl.constexpr,
):
    """Slots ``S`` and ``S + 1`` decoded in float32 and rounded to ``DT`` (the second group's
    scale for the second half of the slots of a 16-element-group type)."""
    SLOTS: tl.constexpr = 4 if BYTE else 8
    if S < SLOTS // 2:
        scale_s, low_min_s = scale, low_min
    else:
        scale_s, low_min_s = scale1, low_min1
    first = slot_weights(
        nib,
        pair,
        bit,
        byte,
        lut_ptr,
        scale_s,
        low_min_s,
        S,
        NIB,
        PAIR,
        BIT,
        BYTE,
        OFFSET,
        LUT,
        MINS,
    )
    second = slot_weights(
        nib,
        pair,
        bit,
        byte,
        lut_ptr,
        scale_s,
        low_min_s,
        S + 1,
        NIB,
        PAIR,
        BIT,
        BYTE,
        OFFSET,
        LUT,
        MINS,
    )
    return first.to(DT), second.to(DT)


@triton.jit
def _natural8(
    w0, w1, w2, w3, w4, w5, w6, w7, BN: tl.constexpr, Q: tl.constexpr, ROWS_LAST: tl.constexpr
):
    """Slots ``0..7`` of a ``[BN, Q, 4]`` tile of 4-bit codes → ``[BN, 32 Q]`` in column order
    (slot ``s``, word ``u`` of quad ``q`` is column ``32 q + 4 s + u``), or its transpose
    ``[32 Q, BN]`` (``ROWS_LAST``). The values stay in the thread that decoded them: the joins
    add in-thread dimensions, the permutation only renames them."""
    low = tl.join(tl.join(w0, w1), tl.join(w2, w3))  # [BN, Q, u, s0, s1]
    high = tl.join(tl.join(w4, w5), tl.join(w6, w7))
    every = tl.join(low, high)  # [BN, Q, u, s0, s1, s2]
    if ROWS_LAST:
        tile = tl.reshape(tl.permute(every, (1, 5, 4, 3, 2, 0)), (32 * Q, BN))
    else:
        tile = tl.reshape(tl.permute(every, (0, 1, 5, 4, 3, 2)), (BN, 32 * Q))
    return tile


@triton.jit
def _natural4(w0, w1, w2, w3, BN: tl.constexpr, Q: tl.constexpr, ROWS_LAST: tl.constexpr):
    """Slots ``0..3`` of a ``[BN, Q, 4]`` tile of 8-bit codes → ``[BN, 16 Q]`` in column
    order (a quad is half a chunk: slot ``s``, word ``u`` of quad ``q`` is column
    ``32 (q // 2) + 8 s + 4 (q % 2) + u``), or its transpose (``ROWS_LAST``)."""
    every = tl.join(tl.join(w0, w1), tl.join(w2, w3))  # [BN, Q, u, s0, s1]
    every = tl.reshape(every, (BN, Q // 2, 2, 4, 2, 2))  # [BN, chunk, half, u, s0, s1]
    if ROWS_LAST:
        tile = tl.reshape(tl.permute(every, (1, 5, 4, 2, 3, 0)), (16 * Q, BN))
    else:
        tile = tl.reshape(tl.permute(every, (0, 1, 5, 4, 2, 3)), (BN, 16 * Q))
    return tile


@step_jit(
    values=["M", "quads_per_split", "n_split"], pointers=["x_ptr", "y_ptr", "b_ptr", "ws_ptr"]
)
def _mma_kernel(
    x_ptr,
    nib_ptr,
    pair_ptr,
    bit_ptr,
    byte_ptr,
    d_ptr,
    dm_ptr,
    sc_ptr,
    mn_ptr,
    lut_ptr,
    b_ptr,
    y_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_ym,
    quads_per_split,
    n_split,
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
    BM: tl.constexpr,
    BN: tl.constexpr,
    Q: tl.constexpr,
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
    FAST: tl.constexpr,
    W_LEFT: tl.constexpr,
    EVEN: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SPLIT: tl.constexpr,
    GATE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_k = tl.program_id(2)
    rows = pid_n * BN + tl.arange(0, BN)
    row_mask = rows < N
    offs_m = pid_m * BM + tl.arange(0, BM)
    m_mask = offs_m < M
    r2 = rows[:, None]
    q_begin, q_end = quad_range(pid_k, quads_per_split, K, BYTE)
    qs = tl.arange(0, Q)
    xrow = x_ptr + offs_m.to(tl.int64)[:, None] * stride_xm
    F16: tl.constexpr = FAST == 1 or FAST == 2
    DT: tl.constexpr = tl.float16 if F16 else x_ptr.dtype.element_ty

    wait_prior(USE_PDL)  # x is the previous kernel's output; the loop below pipelines its loads
    allow_next(USE_PDL)
    if W_LEFT:
        acc = tl.zeros((BN, BM), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    # the scale fields are loaded one step ahead (their narrow loads are not pipelined by the
    # compiler the way the code and activation tiles are)
    fields = _scale_fields(
        d_ptr,
        dm_ptr,
        sc_ptr,
        mn_ptr,
        r2,
        row_mask,
        q_begin,
        qs,
        q_end,
        s_d,
        s_sc,
        BYTE,
        GROUP,
        QBLOCK,
        SCALES,
        MINS,
        EVEN,
    )
    for q0 in range(q_begin, q_end, Q):
        nib, pair, bit, byte = load_code_tile(
            nib_ptr,
            pair_ptr,
            bit_ptr,
            byte_ptr,
            rows,
            row_mask,
            q0,
            q_end,
            s_nib,
            s_pair,
            s_bit,
            s_byte,
            BN,
            Q,
            NIB,
            PAIR,
            BIT,
            BYTE,
            EVEN,
        )
        d, dm, sc0, sc1, mn = fields
        fields = _scale_fields(
            d_ptr,
            dm_ptr,
            sc_ptr,
            mn_ptr,
            r2,
            row_mask,
            q0 + Q,
            qs,
            q_end,
            s_d,
            s_sc,
            BYTE,
            GROUP,
            QBLOCK,
            SCALES,
            MINS,
            EVEN,
        )
        if FAST == 1:
            # 4-bit codes, one group per quad: d * (a * q) + c with a the sub-scale (1 when
            # the type has none) and c = -(d * a * offset + min)
            a = tl.full((BN, Q), 1.0, tl.float32)
            if SCALES == 1:
                a = sc0.to(tl.float32)
            c = -(d.to(tl.float32) * a * OFFSET)
            if MINS != 0:
                scale, low_min = group_scales(d, dm, sc0, mn, SCALES, MINS)
                c = c - low_min
            a16 = tl.broadcast_to(a.to(tl.float16)[:, :, None], (BN, Q, 4))
            d16 = tl.broadcast_to(d.to(tl.float16)[:, :, None], (BN, Q, 4))
            c16 = tl.broadcast_to(c.to(tl.float16)[:, :, None], (BN, Q, 4))
            w0, w1, w2, w3, w4, w5, w6, w7 = tl.inline_asm_elementwise(
                _NIB_FP16,
                _NIB_CONSTRAINTS,
                [nib, a16, d16, c16],
                dtype=(tl.float16,) * 8,
                is_pure=True,
                pack=2,
            )
            w = _natural8(w0, w1, w2, w3, w4, w5, w6, w7, BN, Q, not W_LEFT)
        elif FAST == 2:
            d16 = tl.broadcast_to(d.to(tl.float16)[:, :, None], (BN, Q, 4))
            w0, w1, w2, w3 = tl.inline_asm_elementwise(
                _BYTE_FP16,
                _BYTE_CONSTRAINTS,
                [byte, d16],
                dtype=(tl.float16,) * 4,
                is_pure=True,
                pack=2,
            )
            w = _natural4(w0, w1, w2, w3, BN, Q, not W_LEFT)
        elif FAST == 3:
            # 4-bit codes: 256 + q (low nibble of byte p) and 16 + q (high nibble) from the
            # bits; w = v * scale + c with c = -(base + offset) * scale - min
            scale, low_min = group_scales(d, dm, sc0, mn, SCALES, MINS)
            c_lo = -(256.0 + OFFSET) * scale
            c_hi = -(16.0 + OFFSET) * scale
            if MINS != 0:
                c_lo = c_lo - low_min
                c_hi = c_hi - low_min
            scale3 = scale[:, :, None]
            c_lo = c_lo[:, :, None]
            c_hi = c_hi[:, :, None]
            w0, w1 = _nibble_bits(
                nib, 0, scale3, c_lo, c_hi, mask_lo, mask_hi, magic_lo, magic_hi, DT
            )
            w2, w3 = _nibble_bits(
                nib, 1, scale3, c_lo, c_hi, mask_lo, mask_hi, magic_lo, magic_hi, DT
            )
            w4, w5 = _nibble_bits(
                nib, 2, scale3, c_lo, c_hi, mask_lo, mask_hi, magic_lo, magic_hi, DT
            )
            w6, w7 = _nibble_bits(
                nib, 3, scale3, c_lo, c_hi, mask_lo, mask_hi, magic_lo, magic_hi, DT
            )
            w = _natural8(w0, w1, w2, w3, w4, w5, w6, w7, BN, Q, not W_LEFT)
        elif FAST == 4:
            # 8-bit codes stored as q + 128: 256 + (q + 128) from the bits
            scale = d.to(tl.float32)[:, :, None]
            c = -(256.0 + OFFSET) * scale
            w0 = (_as_float(_byte_to_bits_15(byte, 0), mask_lo, magic_lo) * scale + c).to(DT)
            w1 = (_as_float(_byte_to_bits_15(byte, 1), mask_lo, magic_lo) * scale + c).to(DT)
            w2 = (_as_float(_byte_to_bits_15(byte, 2), mask_lo, magic_lo) * scale + c).to(DT)
            w3 = (_as_float(_byte_to_bits_15(byte, 3), mask_lo, magic_lo) * scale + c).to(DT)
            w = _natural4(w0, w1, w2, w3, BN, Q, not W_LEFT)
        else:
            scale, low_min = group_scales(d, dm, sc0, mn, SCALES, MINS)
            scale1, low_min1 = group_scales(d, dm, sc1, mn, SCALES, MINS)
            w0, w1 = _generic2(
                nib,
                pair,
                bit,
                byte,
                lut_ptr,
                scale,
                low_min,
                scale1,
                low_min1,
                0,
                NIB,
                PAIR,
                BIT,
                BYTE,
                OFFSET,
                LUT,
                MINS,
                DT,
            )
            w2, w3 = _generic2(
                nib,
                pair,
                bit,
                byte,
                lut_ptr,
                scale,
                low_min,
                scale1,
                low_min1,
                2,
                NIB,
                PAIR,
                BIT,
                BYTE,
                OFFSET,
                LUT,
                MINS,
                DT,
            )
            if BYTE:
                w = _natural4(w0, w1, w2, w3, BN, Q, not W_LEFT)
            else:
                w4, w5 = _generic2(
                    nib,
                    pair,
                    bit,
                    byte,
                    lut_ptr,
                    scale,
                    low_min,
                    scale1,
                    low_min1,
                    4,
                    NIB,
                    PAIR,
                    BIT,
                    BYTE,
                    OFFSET,
                    LUT,
                    MINS,
                    DT,
                )
                w6, w7 = _generic2(
                    nib,
                    pair,
                    bit,
                    byte,
                    lut_ptr,
                    scale,
                    low_min,
                    scale1,
                    low_min1,
                    6,
                    NIB,
                    PAIR,
                    BIT,
                    BYTE,
                    OFFSET,
                    LUT,
                    MINS,
                    DT,
                )
                w = _natural8(w0, w1, w2, w3, w4, w5, w6, w7, BN, Q, not W_LEFT)
        KQ: tl.constexpr = 16 * Q if BYTE else 32 * Q
        cols = (q0 // 2 if BYTE else q0) * 32 + tl.arange(0, KQ)
        if EVEN:
            xmask = m_mask[:, None]
        else:
            xmask = m_mask[:, None] & (cols < (q_end // 2 if BYTE else q_end) * 32)[None, :]
        x = _load_x(xrow + cols[None, :], xmask, K, GATE, DT, F16)
        if W_LEFT:
            acc = tl.dot(w, tl.trans(x), acc, input_precision=DOT_PRECISION)
        else:
            acc = tl.dot(x, w, acc, input_precision=DOT_PRECISION)

    if W_LEFT:
        y = tl.trans(acc)  # [BM, BN]
    else:
        y = acc
    mask = m_mask[:, None] & row_mask[None, :]
    if SPLIT:
        tile = pid_m * tl.num_programs(0) + pid_n
        finish_tile(
            y,
            ws_ptr,
            cnt_ptr,
            tile,
            pid_k,
            n_split,
            offs_m,
            rows,
            row_mask,
            mask,
            M * N,
            N,
            y_ptr,
            stride_ym,
            b_ptr,
            HAS_BIAS,
        )
    else:
        if HAS_BIAS:
            y += tl.load(b_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)[None, :]
        out = y_ptr + offs_m[:, None].to(tl.int64) * stride_ym + rows[None, :]
        tl.store(out, y.to(y_ptr.dtype.element_ty), mask=mask)


def decode_mode(p: PackedWeight, decoding: int, x_dtype: torch.dtype) -> int:
    """The kernel's ``FAST`` constant for a configuration's ``decoding`` (0 generic, 1 fp16 in
    PTX, 2 float32 from exponent bits): 1/2 the PTX decoding of 4-bit/8-bit codes, 3/4 the
    exponent-bits decoding of them, 0 the generic one (every other type, float32 x, and the
    PTX decoding under Triton's interpreter, which cannot run PTX)."""
    qt = p.qtype
    if decoding == 0 or x_dtype == torch.float32:
        return 0
    if qt.byte:
        kind = 2
    elif qt.nib and not (qt.pair or qt.bit or qt.lut) and qt.group == 32:
        kind = 1
    else:
        return 0
    if decoding == 1:
        return 0 if interpreting() else kind
    return kind + 2


def weights_left(bm: int) -> bool:
    """Whether the weight tile is the left operand of the product (kept in registers): for
    tiles of fewer than 64 rows of x, which Hopper's ``wgmma`` could only take padded to 64;
    from 64 rows on, x is the left operand and the decoded weights go to shared memory, where
    ``wgmma`` reads them in place."""
    return bm < 64


def mma_config(m: int, n: int, k: int) -> tuple[int, int, int, int, int, int, int]:
    """(BM, BN, Q, warps, stages, K slices, decoding) where no tuned entry exists: starting
    points tuned on Hopper."""
    if m <= 16:
        return 16, 64, 8, 4, 3, 1, 1
    if m <= 64:
        return 64, 64, 8, 4, 3, 1, 1
    return 128, 128, 4, 8, 3, 1, 2


def qmatmul_triton(
    x: torch.Tensor,
    p: PackedWeight,
    bias: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    gate: str | None = None,
    config: tuple[int, int, int, int, int, int, int] | None = None,
) -> torch.Tensor:
    """``x [M, K] @ W.T (+ bias)`` → ``[M, N]`` in x's dtype (``x [M, 2K]`` with ``gate``).
    ``out`` (``[M, N]``, rows contiguous, e.g. a column slice of a wider output) receives it in
    place. ``config`` is ``(BM, BN, Q, warps, stages, K slices, decoding)``; the decodings
    other than the generic one apply to the types that have them (:func:`decode_mode`) and to
    half-precision x."""
    m = x.shape[0]
    n, k = p.rows, p.cols
    check_offsets(p)
    if x.stride(-1) != 1:
        x = x.contiguous()
    if out is None:
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    bm, bn, q, warps, stages, splits, decoding = config or mma_config(m, n, k)
    n_quads = k // 32 * quads_per_chunk(p)
    per, n_split = split_chunks(n_quads, q, splits)
    grid = (triton.cdiv(n, bn), triton.cdiv(m, bm), n_split)
    split = n_split > 1
    ws = workspace(n_split, m, n, x.device) if split else out
    cnt = counters(x.device) if split else ws
    if split and grid[0] * grid[1] > cnt.numel():
        raise ValueError(
            f"qmatmul: {grid[0] * grid[1]} output tiles exceed the {cnt.numel()} split counters"
        )
    mode = decode_mode(p, int(decoding), x.dtype)
    even = n % bn == 0 and per % q == 0 and n_quads % per == 0
    ptrs, strides = plane_args(p)
    use_pdl = pdl_enabled(x)
    _mma_kernel[grid](
        x,
        *ptrs,
        bias if bias is not None else ptrs[4],
        out,
        ws,
        cnt,
        m,
        n,
        k,
        x.stride(0),
        out.stride(0),
        per,
        n_split,
        *strides,
        *bit_constants(mode == 4),
        BM=bm,
        BN=bn,
        Q=q,
        **type_constants(p),
        FAST=mode,
        W_LEFT=weights_left(bm),
        EVEN=even,
        HAS_BIAS=bias is not None,
        SPLIT=split,
        GATE=-1 if gate is None else KINDS[gate],
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
        USE_PDL=use_pdl,
        num_warps=warps,
        num_stages=stages,
        launch_pdl=use_pdl,
    )
    return out
