"""Float weights → GGML block-quantized bytes, on any torch device.

:func:`quantize` turns a float matrix ``[rows, cols]`` into the uint8 matrix
``[rows, cols // block_elems * type_bytes]`` that a GGUF file stores for that tensor (GGML's
block layout, rows independent). It serves in-situ quantization at load time, where an 8B
model is quantized layer by layer on the GPU, and ``tallow quantize``, which writes GGUF files.
Every step is a tensor operation over all blocks at once; the only Python loops run over the
positions inside a block and over the candidate scales of a search, never over blocks.

- Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 produce exactly the bytes of llama.cpp's ``quantize_row_*_ref``
  and, but for the sign of a zero scale or minimum (blocks of signed zeros), of
  ``gguf.quants.quantize`` (the ``gguf`` package's numpy quantizers): same float32 operations
  in the same order, the same first-of-ties choice of the absolute maximum, the same rounding.
- The k-quants (Q2_K … Q6_K) follow llama.cpp's reference quantizers (``quantize_row_*_ref`` in
  ggml-quants.c, what ``llama-quantize`` runs without an importance matrix): the per-sub-block
  scale/min search, then the 6- or 8-bit quantization of the sub-block scales against one
  float16 super-block scale, then the final rounding of every weight against the quantized
  scales (:mod:`tallow_quant_gguf.quantize_kquants`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from . import quantize_kquants as kq
from .quantize_ops import f16_bytes, pack_bits, scalar

__all__ = ["QuantType", "QUANT_TYPES", "quantize", "quant_type", "quantized_row_bytes"]


@dataclass(frozen=True)
class QuantType:
    """One GGML block type: ``block_elems`` weights stored in ``type_bytes`` bytes."""

    name: str
    #: GGMLQuantizationType value, as GGUF files record it
    ggml_type: int
    block_elems: int
    type_bytes: int
    #: [n, block_elems] float32 → [n, type_bytes] uint8, on the input's device
    quantize_blocks: Callable[[torch.Tensor], torch.Tensor]


# --------------------------------------------------------------------------------------------
# The 32-element types, matching gguf.quants.quantize byte for byte
# --------------------------------------------------------------------------------------------
def _signed_absmax(blocks: torch.Tensor) -> torch.Tensor:
    """The value of largest magnitude of each block, with its sign; the first one on ties, as
    llama.cpp's ``if (amax < fabsf(v))`` loop finds it. A block of zeros gives +0.0 (the loop's
    initial value) whatever the zeros' signs: ``-0.0 / -8`` would store the scale as +0.0 where
    llama.cpp stores -0.0."""
    index = blocks.abs().argmax(dim=-1, keepdim=True)
    value = torch.gather(blocks, -1, index)
    return torch.where(value == 0, torch.zeros_like(value), value)


def _first_extreme(blocks: torch.Tensor, largest: bool) -> torch.Tensor:
    """The minimum (or maximum) of each block as a sequential ``if (v < min)`` scan keeps it:
    its first occurrence, so that of zeros of both signs the first one's sign is kept."""
    index = (blocks.argmax if largest else blocks.argmin)(dim=-1, keepdim=True)
    return torch.gather(blocks, -1, index)


def _inverse_or_zero(d: torch.Tensor) -> torch.Tensor:
    """``1 / d`` where ``d`` is not zero, else 0 (a block of zeros keeps its codes at the
    offset)."""
    inv = scalar(1.0, d) / torch.where(d == 0, torch.ones_like(d), d)
    return torch.where(d == 0, torch.zeros_like(d), inv)


def _symmetric_codes(blocks: torch.Tensor, levels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_0/Q5_0: the scale ``d = max / -levels`` (float32) and the codes
    ``trunc(x / d + levels + 0.5)`` clipped to ``[0, 2*levels - 1]``."""
    d = _signed_absmax(blocks) / scalar(-float(levels), blocks)
    codes = torch.trunc(blocks * _inverse_or_zero(d) + (levels + 0.5))
    return d, codes.clamp(0, 2 * levels - 1).to(torch.uint8)


def _affine_codes(
    blocks: torch.Tensor, levels: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_1/Q5_1: ``d = (max - min) / (levels - 1)``, ``m = min`` and the codes
    ``trunc((x - min) / d + 0.5)`` clipped to ``[0, levels - 1]``."""
    hi = _first_extreme(blocks, largest=True)
    lo = _first_extreme(blocks, largest=False)
    d = (hi - lo) / scalar(float(levels - 1), blocks)
    codes = torch.trunc((blocks - lo) * _inverse_or_zero(d) + 0.5)
    return d, lo, codes.clamp(0, levels - 1).to(torch.uint8)


def _nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Element ``j`` in the low nibble and ``j + 16`` in the high nibble of byte ``j``."""
    return (codes[:, :16] & 0x0F) | ((codes[:, 16:] & 0x0F) << 4)


def _quantize_q4_0(blocks: torch.Tensor) -> torch.Tensor:
    d, codes = _symmetric_codes(blocks, 8)
    return torch.cat([f16_bytes(d), _nibbles(codes)], dim=-1)


def _quantize_q4_1(blocks: torch.Tensor) -> torch.Tensor:
    d, m, codes = _affine_codes(blocks, 16)
    return torch.cat([f16_bytes(d), f16_bytes(m), _nibbles(codes)], dim=-1)


def _quantize_q5_0(blocks: torch.Tensor) -> torch.Tensor:
    d, codes = _symmetric_codes(blocks, 16)
    return torch.cat([f16_bytes(d), pack_bits(codes >> 4), _nibbles(codes)], dim=-1)


def _quantize_q5_1(blocks: torch.Tensor) -> torch.Tensor:
    d, m, codes = _affine_codes(blocks, 32)
    return torch.cat([f16_bytes(d), f16_bytes(m), pack_bits(codes >> 4), _nibbles(codes)], dim=-1)


def _round_half_away(x: torch.Tensor) -> torch.Tensor:
    """C's ``roundf``: halves away from zero. ``floor(|x| + 0.5)`` would round 0.49999997 up
    (the sum rounds to 1.0); splitting off the integer part first is exact."""
    a = x.abs()
    whole = torch.floor(a)
    return torch.sign(x) * (whole + torch.floor(2 * (a - whole)))


def _quantize_q8_0(blocks: torch.Tensor) -> torch.Tensor:
    d = blocks.abs().amax(dim=-1, keepdim=True) / scalar(127.0, blocks)
    codes = _round_half_away(blocks * _inverse_or_zero(d)).to(torch.int8).view(torch.uint8)
    return torch.cat([f16_bytes(d), codes], dim=-1)


QUANT_TYPES: dict[str, QuantType] = {
    t.name: t
    for t in (
        QuantType("q4_0", 2, 32, 18, _quantize_q4_0),
        QuantType("q4_1", 3, 32, 20, _quantize_q4_1),
        QuantType("q5_0", 6, 32, 22, _quantize_q5_0),
        QuantType("q5_1", 7, 32, 24, _quantize_q5_1),
        QuantType("q8_0", 8, 32, 34, _quantize_q8_0),
        QuantType("q2_k", 10, kq.QK_K, 84, kq.quantize_q2_k),
        QuantType("q3_k", 11, kq.QK_K, 110, kq.quantize_q3_k),
        QuantType("q4_k", 12, kq.QK_K, 144, kq.quantize_q4_k),
        QuantType("q5_k", 13, kq.QK_K, 176, kq.quantize_q5_k),
        QuantType("q6_k", 14, kq.QK_K, 210, kq.quantize_q6_k),
    )
}


def quant_type(name: str) -> QuantType:
    """The :class:`QuantType` called ``name`` (case-insensitive: ``"Q4_K"`` or ``"q4_k"``)."""
    key = name.lower() if isinstance(name, str) else name
    if key not in QUANT_TYPES:
        raise ValueError(
            f"quantization type {name!r} is not supported; expected one of {', '.join(QUANT_TYPES)}"
        )
    return QUANT_TYPES[key]


def quantized_row_bytes(cols: int, qtype: str) -> int:
    """Bytes of one quantized row of ``cols`` weights."""
    t = quant_type(qtype)
    if cols % t.block_elems:
        raise ValueError(f"a {t.name} row needs a multiple of {t.block_elems} weights, got {cols}")
    return cols // t.block_elems * t.type_bytes


def _chunk_blocks(t: QuantType, device: torch.device) -> int:
    """Blocks quantized per step: bounded temporaries (the k-quant searches keep a few dozen
    float32 copies of their chunk alive), large enough that per-operation overhead vanishes."""
    elems = (1 << 24) if device.type == "cuda" else (1 << 21)
    return max(1, elems // t.block_elems)


def quantize(weights: torch.Tensor, qtype: str) -> torch.Tensor:
    """Quantize ``weights`` [rows, cols] (any float dtype, any device) to GGML type ``qtype``.

    Returns uint8 ``[rows, cols // block_elems * type_bytes]`` on the same device: each row is
    its blocks in order, each block in GGML's byte layout, as a GGUF file stores the tensor
    (``gguf.quants.dequantize(out.numpy(), type)`` reads it back). ``cols`` must be a multiple
    of the type's block size (32, or 256 for the k-quants). Values are taken in float32.
    """
    t = quant_type(qtype)
    if not isinstance(weights, torch.Tensor) or weights.dim() != 2:
        shape = tuple(weights.shape) if isinstance(weights, torch.Tensor) else type(weights)
        raise ValueError(f"quantize expects a 2-D tensor [rows, cols], got {shape}")
    if not weights.is_floating_point():
        raise ValueError(f"quantize expects floating-point weights, got {weights.dtype}")
    rows, cols = weights.shape
    row_bytes = quantized_row_bytes(cols, t.name)
    blocks = weights.detach().to(torch.float32).reshape(-1, t.block_elems)
    out = torch.empty((blocks.shape[0], t.type_bytes), dtype=torch.uint8, device=weights.device)
    step = _chunk_blocks(t, weights.device)
    for start in range(0, blocks.shape[0], step):
        out[start : start + step] = t.quantize_blocks(blocks[start : start + step].contiguous())
    return out.view(rows, row_bytes)
