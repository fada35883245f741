"""The GGML block types this plugin keeps quantized, described by how their values decode.

Every supported type decodes an element the same way::

    value = S[group] * f(q) - M[group]

``q`` is the element's integer code, assembled from up to three bit planes (a 4-bit
*nibble*, a 2-bit *pair*, one *bit*; or an 8-bit *byte*, Q8_0's signed code stored plus 128),
``f(q)`` is ``q - offset`` or,
for the IQ4 types, a lookup in a 16-entry table. The scale ``S`` of a group of 16 or 32
elements is the block's fp16 ``d``, optionally times an integer sub-scale; the optional min
``M`` is the block's fp16 ``dm``, optionally times an integer sub-min. Products are formed in
float32 in the order the ``gguf`` package (and ggml) uses, so the decoded values are the same
bits. :mod:`tallow_quant_gguf.packing` turns GGML blocks into those planes.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the 16 values of the non-linear 4-bit types (IQ4_NL, IQ4_XS), as ggml defines them
IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)

#: scale modes: the block's d alone; d times an int8 sub-scale; Q2_K's packed byte (low
#: nibble the sub-scale, high nibble the sub-min)
SCALE_BLOCK, SCALE_SUB, SCALE_PACKED = 0, 1, 2
#: min modes: none; the block's dm (Q4_1/Q5_1 store it negated); dm times an int8 sub-min;
#: dm times the high nibble of Q2_K's packed byte
MIN_NONE, MIN_BLOCK, MIN_SUB, MIN_PACKED = 0, 1, 2, 3


@dataclass(frozen=True)
class QuantType:
    """One GGML block type (see the module docstring for the decoding)."""

    name: str
    #: elements per GGML block and its size in bytes
    block: int
    block_bytes: int
    nib: bool = False
    pair: bool = False
    bit: bool = False
    byte: bool = False
    offset: int = 0
    lut: bool = False
    #: elements sharing one scale (and min)
    group: int = 32
    scales: int = SCALE_BLOCK
    mins: int = MIN_NONE

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.block_bytes / self.block

    def row_bytes(self, cols: int) -> int:
        """Bytes of one GGML row of ``cols`` elements."""
        return cols // self.block * self.block_bytes


_TYPES = [
    QuantType("Q4_0", 32, 18, nib=True, offset=8),
    QuantType("Q4_1", 32, 20, nib=True, mins=MIN_BLOCK),
    QuantType("Q5_0", 32, 22, nib=True, bit=True, offset=16),
    QuantType("Q5_1", 32, 24, nib=True, bit=True, mins=MIN_BLOCK),
    QuantType("Q8_0", 32, 34, byte=True, offset=128),
    QuantType("Q2_K", 256, 84, pair=True, group=16, scales=SCALE_PACKED, mins=MIN_PACKED),
    QuantType("Q3_K", 256, 110, pair=True, bit=True, offset=4, group=16, scales=SCALE_SUB),
    QuantType("Q4_K", 256, 144, nib=True, scales=SCALE_SUB, mins=MIN_SUB),
    QuantType("Q5_K", 256, 176, nib=True, bit=True, scales=SCALE_SUB, mins=MIN_SUB),
    QuantType("Q6_K", 256, 210, nib=True, pair=True, offset=32, group=16, scales=SCALE_SUB),
    QuantType("IQ4_NL", 32, 18, nib=True, lut=True),
    QuantType("IQ4_XS", 256, 136, nib=True, lut=True, scales=SCALE_SUB),
]

#: GGML name -> type, for every block type kept quantized
QUANT_TYPES: dict[str, QuantType] = {t.name: t for t in _TYPES}
#: float types that pass through as dense weights
DENSE_TYPES = ("F32", "F16", "BF16")
#: the types ``model.isq`` may name (lower case, as on the command line)
ISQ_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k")


def quant_type(name: str) -> QuantType:
    """The type called ``name`` (any case); ValueError listing the supported ones otherwise."""
    try:
        return QUANT_TYPES[name.upper()]
    except KeyError:
        known = ", ".join(QUANT_TYPES)
        raise ValueError(
            f"GGML type {name!r} is not kept quantized by tallow-quant-gguf "
            f"(supported: {known}; {', '.join(DENSE_TYPES)} pass through as "
            "dense weights)"
        ) from None
