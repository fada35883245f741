"""Decoding e2m1 codes and their scales inside a Triton kernel, without a lookup table.

An e2m1 code ``s e1 e0 m`` is, for a magnitude ``c = e1 e0 m`` of 2 or more, the float32
whose bits are ``(126 << 23) + (c << 22)`` (exponent ``126 + e``, top mantissa bit ``m``:
``2 ** (e - 1) * (1 + m / 2)``); magnitudes 0 and 1 are 0 and 0.5, whose bits are
``c * (126 << 23)``. The sign bit moves to bit 31. A scale byte becomes float32 the same way:
e8m0 ``e`` is ``2 ** (e - 127)`` (bits ``e << 23``; ``e = 0``, ``2 ** -127``, is the subnormal
``1 << 22``), e4m3 ``s eeee mmm`` is ``2 ** (e - 7) * (1 + m / 8)`` (bits ``(e + 120) << 23 |
m << 20``), or ``m * 2 ** -9`` when ``e = 0``.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def e2m1(code):
    """float32 values of int32 e2m1 codes (the low 4 bits)."""
    mag = code & 7
    bits = tl.where(mag < 2, mag * 0x3F000000, 0x3F000000 + (mag << 22))
    return (bits | ((code & 8) << 28)).to(tl.float32, bitcast=True)


#: the masks of :func:`e2m1_pair`: magnitude bits 9..11 and 25..27, sign bits 15 and 31
PAIR_MAGNITUDES, PAIR_SIGNS = 0x0E000E00, -0x7FFF8000  # the int32 of 0x80008000
#: :func:`e2m1_pair`'s values are the codes' values times this power of two
PAIR_FACTOR = 2.0**-14


@triton.jit
def e2m1_pair(word, S: tl.constexpr, mag_mask, sign_mask):
    """float32 values, times :data:`PAIR_FACTOR`, of the e2m1 codes in nibbles ``S`` and
    ``S + 4`` of int32 ``word`` (S in 0..3).

    Two shifts and two mask-and-ors build two float16 words at once: nibble ``S`` (bits 4S..)
    in the low half, nibble ``S + 4`` (bits 16 + 4S..) in the high half, each magnitude in
    bits 9..11 (the two low exponent bits and the top mantissa bit) and each sign in bit 15.
    Such a float16 is ``2 ** -14`` times the code's value: magnitude 1 is the subnormal
    ``2 ** -15``, which float16 keeps. The masks are runtime arguments so that each
    mask-and-or is one instruction."""
    if S < 3:
        t_mag = word << (9 - 4 * S)
    else:
        t_mag = word >> 3
    t_sign = word << (12 - 4 * S)
    r = (t_mag & mag_mask) | (t_sign & sign_mask)
    lo = r.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    hi = (r >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def e4m3_value(b):
    """float32 value of e4m3 bytes ``b`` (int32)."""
    e = (b >> 3) & 15
    m = b & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    v = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)
    return tl.where((b & 128) != 0, -v, v)


@triton.jit
def scale_value(b, global_scale, NV: tl.constexpr):
    """float32 scale of scale bytes ``b`` (int32): e8m0, or (``NV``) e4m3 over the global
    scale, divided with correct rounding as the format defines it (the reference's bits)."""
    b = b.to(tl.int32)
    if NV:
        v = tl.math.div_rn(e4m3_value(b), global_scale)
    else:
        v = tl.where(b == 0, 1 << 22, b << 23).to(tl.float32, bitcast=True)
    return v
