"""Turning packed integer codes into float32 inside a Triton kernel without a conversion
instruction, for the kernels of quantized weights.

One shift puts a byte of a 32-bit word of codes into bits 15..22 (:func:`byte_to_bits_15`);
a mask-and-or with the bits of 256.0 then makes a word that, read as a float32, *is*
``256 + q`` for the low 4-bit field (bits 15..18) or for the whole byte (bits 15..22), and with
the bits of 16.0, ``16 + q`` for the high 4-bit field (bits 19..22) (:func:`bits_as_float`).
Kernels pass the masks and magic words as runtime arguments (:func:`bit_constants`), so the
compiler keeps them in registers and forms one three-input logic instruction per value, and
take the offsets (256, 16) out of their sums once, through the sums of the activations.
"""

from __future__ import annotations

import triton
import triton.language as tl

#: 256.0 and 16.0 as float32 bits: a field in bits 15..22 (15..18) of the first, or in bits
#: 19..22 of the second, reads as the field's value plus 256 (16)
MAGIC_256, MAGIC_16 = 0x43800000, 0x41800000
#: the masks that pick bits 15..18, 19..22 and 15..22
MASK_LO4, MASK_HI4, MASK_8 = 0x00078000, 0x00780000, 0x007F8000


def bit_constants(byte_codes: bool) -> tuple[int, int, int, int]:
    """(mask_lo, mask_hi, magic_lo, magic_hi) for 8-bit codes or for pairs of 4-bit ones."""
    return (MASK_8 if byte_codes else MASK_LO4), MASK_HI4, MAGIC_256, MAGIC_16


@triton.jit
def byte_to_bits_15(w, P: tl.constexpr):
    """``w`` (int32) shifted so that its byte ``P`` sits in bits 15..22."""
    if P == 0:
        t = w << 15
    elif P == 1:
        t = w << 7
    elif P == 2:
        t = w >> 1
    else:
        t = w >> 9
    return t


@triton.jit
def bits_as_float(t, mask, magic):
    """The float32 whose bits are ``(t & mask) | magic``."""
    return ((t & mask) | magic).to(tl.float32, bitcast=True)
