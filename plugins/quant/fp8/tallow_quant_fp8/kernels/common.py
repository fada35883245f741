"""Pieces the fp8 kernels share."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def round_to_e4m3(v):
    """float32 ``v`` (``|v| <= 448``) rounded to the nearest e4m3 value, ties to even, still as
    float32. The cast to ``tl.float8e4nv`` that follows is then exact: the GPU's conversion
    rounds the same way, but Triton's CPU interpreter rounds its own way, and the kernels must
    give the reference's bits there too. Normal e4m3 values keep 3 of float32's 23 mantissa
    bits (rounded by the carry of an integer add); below 2^-6 e4m3 is subnormal, a multiple of
    2^-9, which adding and subtracting 2^14 rounds to (float32's spacing there is 2^-9)."""
    a = tl.abs(v)
    bits = a.to(tl.int32, bitcast=True)
    odd = (bits >> 20) & 1
    normal = ((bits + 0x7FFFF + odd) & -1048576).to(tl.float32, bitcast=True)
    subnormal = (a + 16384.0) - 16384.0
    r = tl.where(a < 0.015625, subnormal, normal)
    return tl.where(v < 0, -r, r)


@triton.jit
def quantize_value(x, scale):
    """``x / scale`` (float32, IEEE division: the reference's bits) clamped to +-448 and
    rounded to e4m3."""
    q = tl.math.div_rn(x, scale)
    q = tl.minimum(tl.maximum(q, -448.0), 448.0)
    return round_to_e4m3(q).to(tl.float8e4nv)
