"""Decoding packed planes inside a Triton kernel, shared by every kernel of the plugin.

A tile is ``BN`` rows by ``H`` half-chunks of 8 code bytes (a 32-element chunk's 16 code
bytes are two half-chunks). :func:`decode_parts` returns it as two float32 ``[BN, H, 8]``
tensors of ``f(q)`` (with the scales and mins of their groups; :func:`combine` forms the
values): the elements of the low nibbles (``32c + 8p + i`` for half-chunk ``h = 2c + p``) and
of the high nibbles (``32c + 16 + 8p + i``). Keeping the halves apart means no kernel ever
interleaves nibbles in registers: a product pairs each half with the matching activations.

Why 8: every tensor of a tile then holds 8 consecutive values per thread, whether codes (8
bytes), activations (8 16-bit values: one 16-byte load) or decoded floats, so Triton gives the
codes, the activations and the products one register layout and the loop moves no data
through shared memory. Activations are loaded in the tile's full ``[rows, H, 8]`` shape (each
row of the tile reading the same addresses) for the same reason. Scales are loaded per
half-chunk, ``[BN, H]``, and broadcast.

The type is a set of ``tl.constexpr`` flags (:func:`type_constants`), so each type compiles to
straight-line code for exactly its planes. The float operations are ggml's, in ggml's order
(``d * sc``, ``* f(q)``, ``- dm * mn``); compiled without fused multiply-adds the values are the
same bits as the torch reference.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from ..packing import PackedWeight
from ..qtypes import IQ4_VALUES

_PLANES = ("nib", "pair", "bit", "byte", "d", "dm", "sc", "mn")
_LUTS: dict[torch.device, torch.Tensor] = {}


def type_constants(p: PackedWeight) -> dict[str, Any]:
    """The ``tl.constexpr`` arguments of :func:`decode_parts` for ``p``'s type."""
    qt = p.qtype
    return dict(NIB=qt.nib, PAIR=qt.pair, BIT=qt.bit, BYTE=qt.byte, OFFSET=qt.offset,
                LUT=qt.lut, GROUP=qt.group, QBLOCK=qt.block, SCALES=qt.scales, MINS=qt.mins,
                BIT_SHIFT=4 if qt.nib else 2)


def plane_args(p: PackedWeight) -> tuple[list[torch.Tensor], list[int]]:
    """The plane pointers (absent planes: any tensor, never read) and the row strides of the
    nib, pair, bit, byte, d and sc planes, in :func:`decode_parts`'s order; the lookup table of
    the IQ4 types is the last pointer."""
    planes = p.planes
    some = planes["d"]
    ptrs = [planes.get(name, some) for name in _PLANES]
    strides = [planes[name].stride(0) if name in planes else 0
               for name in ("nib", "pair", "bit", "byte", "d", "sc")]
    return ptrs + [iq4_table(some.device)], strides


def iq4_table(device: torch.device) -> torch.Tensor:
    """The IQ4 value table on ``device``, made once per device (by the first kernel launch,
    which precedes any CUDA-graph capture: the engine runs each shape eagerly first)."""
    lut = _LUTS.get(device)
    if lut is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("tallow-quant-gguf: the first quantized kernel on "
                               f"{device} ran inside a CUDA-graph capture; run it once "
                               "eagerly first")
        lut = _LUTS[device] = torch.tensor(IQ4_VALUES, dtype=torch.float32, device=device)
    return lut


@triton.jit
def element_offsets(halves, PARTS: tl.constexpr):
    """Column of every value of a ``[PARTS, H, 8]``-shaped tile of low-nibble elements, for
    half-chunks ``halves [H]`` (add 16 for the high nibbles); ``PARTS`` rows of the tile read
    the same columns."""
    h = halves[None, :, None] + tl.zeros((PARTS, 1, 1), dtype=tl.int32)
    return 32 * (h // 2) + 8 * (h % 2) + tl.arange(0, 8)[None, None, :]


@triton.jit
def decode_parts(nib_ptr, pair_ptr, bit_ptr, byte_ptr, d_ptr, dm_ptr, sc_ptr, mn_ptr, lut_ptr,
                 rows, row_mask, halves, half_mask,
                 s_nib, s_pair, s_bit, s_byte, s_d, s_sc,
                 BN: tl.constexpr, H: tl.constexpr,
                 NIB: tl.constexpr, PAIR: tl.constexpr, BIT: tl.constexpr, BYTE: tl.constexpr,
                 OFFSET: tl.constexpr, LUT: tl.constexpr, GROUP: tl.constexpr,
                 QBLOCK: tl.constexpr, SCALES: tl.constexpr, MINS: tl.constexpr,
                 BIT_SHIFT: tl.constexpr):
    """Rows ``rows [BN]`` (any int type), half-chunks ``halves [H]`` → ``(f_lo, f_hi, s_lo,
    s_hi, m_lo, m_hi)``: ``f(q)`` of the low and high elements, float32 ``[BN, H, 8]``, and the
    scale and min of their groups, float32 ``[BN, H]`` (the mins are meaningless when the type
    has none, ``MINS == 0``). Zeros where masked."""
    r3 = rows[:, None, None].to(tl.int64)
    h3 = halves[None, :, None]
    i = tl.arange(0, 8)[None, None, :]
    within = 8 * (h3 % 2) + i  # position of the low element among its chunk's first 16
    m3 = row_mask[:, None, None] & half_mask[None, :, None]
    r2 = rows[:, None].to(tl.int64)
    c2 = halves[None, :] // 2  # the chunk of each half-chunk
    m2 = row_mask[:, None] & half_mask[None, :]

    # -- the integer codes ----------------------------------------------------------------
    q_lo = tl.zeros((BN, H, 8), dtype=tl.int32)
    q_hi = tl.zeros((BN, H, 8), dtype=tl.int32)
    if BYTE:
        p = byte_ptr + r3 * s_byte + (h3 // 2) * 32 + within
        q_lo = tl.load(p, mask=m3, other=0).to(tl.int32)
        q_hi = tl.load(p + 16, mask=m3, other=0).to(tl.int32)
    if NIB:
        b = tl.load(nib_ptr + r3 * s_nib + h3 * 8 + i, mask=m3, other=0).to(tl.int32)
        q_lo = b & 15
        q_hi = b >> 4
    # High bits: shift each word to the half-chunk's first element once, so that the 8 fields
    # of a thread sit at constant positions (one bit-field extract each).
    part2 = halves[None, :] % 2
    if PAIR:
        w_lo = tl.load(pair_ptr + r2 * s_pair + c2 * 2, mask=m2, other=0) >> (16 * part2)
        w_hi = tl.load(pair_ptr + r2 * s_pair + c2 * 2 + 1, mask=m2, other=0) >> (16 * part2)
        two_lo = (w_lo[:, :, None] >> (2 * i)) & 3
        two_hi = (w_hi[:, :, None] >> (2 * i)) & 3
        if NIB:
            q_lo = q_lo | (two_lo << 4)
            q_hi = q_hi | (two_hi << 4)
        else:
            q_lo = two_lo
            q_hi = two_hi
    if BIT:
        w = tl.load(bit_ptr + r2 * s_bit + c2, mask=m2, other=0) >> (8 * part2)
        q_lo = q_lo | (((w[:, :, None] >> i) & 1) << BIT_SHIFT)
        q_hi = q_hi | (((w[:, :, None] >> (i + 16)) & 1) << BIT_SHIFT)
    if LUT:
        f_lo = tl.load(lut_ptr + q_lo)
        f_hi = tl.load(lut_ptr + q_hi)
    else:
        f_lo = (q_lo - OFFSET).to(tl.float32)
        f_hi = (q_hi - OFFSET).to(tl.float32)

    # -- scales and mins of the two halves (a group is 32 elements or 16) ---------------------
    blk = (c2 * 32) // QBLOCK
    d = tl.load(d_ptr + r2 * s_d + blk, mask=m2, other=0.0).to(tl.float32)
    s_lo = d
    s_hi = d
    if SCALES == 1:
        if GROUP == 16:
            s_lo = d * tl.load(sc_ptr + r2 * s_sc + 2 * c2, mask=m2, other=0).to(tl.float32)
            s_hi = d * tl.load(sc_ptr + r2 * s_sc + 2 * c2 + 1, mask=m2, other=0).to(tl.float32)
        else:
            s_lo = d * tl.load(sc_ptr + r2 * s_sc + c2, mask=m2, other=0).to(tl.float32)
            s_hi = s_lo
    if SCALES == 2:  # Q2_K: a byte per 16 elements, low nibble scale, high nibble min
        pk_lo = tl.load(sc_ptr + r2 * s_sc + 2 * c2, mask=m2, other=0).to(tl.int32)
        pk_hi = tl.load(sc_ptr + r2 * s_sc + 2 * c2 + 1, mask=m2, other=0).to(tl.int32)
        s_lo = d * (pk_lo & 15).to(tl.float32)
        s_hi = d * (pk_hi & 15).to(tl.float32)
    m_lo = d
    m_hi = d
    if MINS != 0:
        dm = tl.load(dm_ptr + r2 * s_d + blk, mask=m2, other=0.0).to(tl.float32)
        m_lo = dm
        m_hi = dm
        if MINS == 2:  # group 32: one sub-min for both halves
            m_lo = dm * tl.load(mn_ptr + r2 * s_sc + c2, mask=m2, other=0).to(tl.float32)
            m_hi = m_lo
        if MINS == 3:
            m_lo = dm * (pk_lo >> 4).to(tl.float32)
            m_hi = dm * (pk_hi >> 4).to(tl.float32)
    return f_lo, f_hi, s_lo, s_hi, m_lo, m_hi


@triton.jit
def combine(f, s, m, MINS: tl.constexpr):
    """Decoded values ``s * f(q) - m`` of one half (``[BN, H, 8]``) from :func:`decode_parts`:
    ggml's operations in ggml's order."""
    w = s[:, :, None] * f
    if MINS != 0:
        w = w - m[:, :, None]
    return w
