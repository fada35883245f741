"""Scalar quantization of rotated head vectors: codes, one scale per vector, bit packing.

A head vector ``y`` (D values, already rotated) is stored as D codes of ``bits`` bits and one
float16 ``scale``, read back as ``(code - c) * scale`` with ``c = (2**bits - 1) / 2``: the
levels are symmetric around zero, with no zero point to store. The encoder picks the scale
per vector and computes ``code = floor(y / scale + c + 0.5)`` clamped to
``[0, 2**bits - 1]``:

- 8 and 4 bits: ``scale = max|y| / c``, so the largest coordinate is represented exactly;
- 3 bits: ``scale = STEP_PER_RMS[3] * rms(y)``, the step of the uniform quantizer with the
  least squared error for Gaussian coordinates (a rotated vector's coordinates are close to
  Gaussian); the few coordinates beyond the outer levels are clipped. With 8 levels this
  loses less than spending them on the maximum (a lower perplexity on Qwen2.5-0.5B).

The scale is rounded to float16 first and the codes computed from the rounded scale, so that
encoding and decoding agree on it. A zero vector has scale 0 and decodes to zeros.

Packing (``code_bytes(D, bits)`` bytes per vector; D a multiple of 8):

- 8 bits: byte ``i`` is code ``i``;
- 4 bits: byte ``j < D/2`` holds code ``j`` in its low nibble and code ``j + D/2`` in its high
  nibble;
- 3 bits: ``D/4`` bytes of the low two bits (byte ``j`` holds code ``j + m*D/4`` at bits
  ``2m, 2m+1``, m = 0..3), then ``D/8`` bytes of the third bit (byte ``j`` holds code
  ``j + m*D/8``'s at bit ``m``, m = 0..7).

Each code's byte and bit position are a plain function of its index (for 4 bits: byte
``i % (D/2)``, shift ``4 * (i // (D/2))``), so a kernel reads a whole tile with byte loads of
contiguous runs and shifts, without interleaving.
"""

from __future__ import annotations

import torch

#: code widths the format defines
BITS = (8, 4, 3)
#: bits whose scale is ``STEP_PER_RMS[bits] * rms(y)`` (the others: ``max|y| / c``);
#: the MSE-optimal uniform step for a unit Gaussian with 2**bits levels (Max, 1960)
STEP_PER_RMS = {3: 0.5860}


def check_bits(bits: int) -> None:
    if bits not in BITS:
        raise ValueError(f"bits must be one of {', '.join(map(str, BITS))}, got {bits!r}")


def center(bits: int) -> float:
    """The code that stands for 0: ``(2**bits - 1) / 2`` (between two codes)."""
    return (2**bits - 1) / 2


def code_bytes(head_dim: int, bits: int) -> int:
    """Bytes of the packed codes of one head vector."""
    check_bits(bits)
    if head_dim % 8:
        raise ValueError(f"head size {head_dim} is not a multiple of 8")
    return head_dim * bits // 8


def quantize(y: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes uint8 [..., D], scales float16 [...]) of the vectors ``y`` [..., D]."""
    check_bits(bits)
    c = center(bits)
    y = y.float()
    if bits in STEP_PER_RMS:
        scales = (STEP_PER_RMS[bits] * y.pow(2).mean(dim=-1).sqrt()).to(torch.float16)
    else:
        scales = (y.abs().amax(dim=-1) / c).to(torch.float16)
    s = scales.float()[..., None]
    safe = torch.where(s > 0, s, torch.ones_like(s))
    codes = torch.floor(torch.where(s > 0, y / safe, torch.zeros_like(y)) + (c + 0.5))
    return codes.clamp_(0, 2**bits - 1).to(torch.uint8), scales


def dequantize(codes: torch.Tensor, scales: torch.Tensor, bits: int) -> torch.Tensor:
    """float32 [..., D] values of ``codes`` [..., D] with their ``scales`` [...]."""
    return (codes.float() - center(bits)) * scales.float()[..., None]


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes [..., D] (uint8, each below ``2**bits``) packed into [..., code_bytes] bytes."""
    d = codes.shape[-1]
    code_bytes(d, bits)
    c = codes.to(torch.int32)
    if bits == 8:
        return codes.to(torch.uint8)
    if bits == 4:
        half = d // 2
        return (c[..., :half] | (c[..., half:] << 4)).to(torch.uint8)
    quarter, eighth = d // 4, d // 8
    low = c & 3
    lo = sum(low[..., m * quarter : (m + 1) * quarter] << (2 * m) for m in range(4))
    high = (c >> 2) & 1
    hi = sum(high[..., m * eighth : (m + 1) * eighth] << m for m in range(8))
    return torch.cat((lo, hi), dim=-1).to(torch.uint8)


def unpack(packed: torch.Tensor, bits: int, head_dim: int) -> torch.Tensor:
    """The inverse of :func:`pack`: codes [..., head_dim] (uint8)."""
    if packed.shape[-1] != code_bytes(head_dim, bits):
        raise ValueError(
            f"packed codes have {packed.shape[-1]} bytes per vector, expected "
            f"{code_bytes(head_dim, bits)} for {head_dim} codes of {bits} bits"
        )
    if bits == 8:
        return packed.to(torch.uint8)
    b = packed.to(torch.int32)
    if bits == 4:
        return torch.cat((b & 15, b >> 4), dim=-1).to(torch.uint8)
    quarter = head_dim // 4
    lo, hi = b[..., :quarter], b[..., quarter:]
    low = torch.cat([(lo >> (2 * m)) & 3 for m in range(4)], dim=-1)
    high = torch.cat([(hi >> m) & 1 for m in range(8)], dim=-1)
    return (low | (high << 2)).to(torch.uint8)
