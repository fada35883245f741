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
