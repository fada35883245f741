"""Plain-torch references: decoding packed planes to float32, and the matmul and embedding
that the Triton kernels implement.

The decoded values are bit-identical to ``gguf.quants.dequantize`` of the original GGML
blocks: each step is the same float32 operation, in the same order (``d * sc`` first, then
``* f(q)``, then ``- dm * mn``), run as separate elementwise ops (no fused multiply-add).
These functions are what the CPU path runs: correct and exact, not fast.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .packing import PackedWeight
from .qtypes import IQ4_VALUES, MIN_BLOCK, MIN_PACKED, MIN_SUB, SCALE_PACKED, SCALE_SUB


def _bits_of(words: torch.Tensor, width: int) -> torch.Tensor:
    """int32 words ``[R, W]`` → their ``32 / width`` fields of ``width`` bits, low first."""
    per_word = 32 // width
    shifts = torch.arange(per_word, dtype=torch.int32, device=words.device) * width
    return ((words.unsqueeze(-1) >> shifts) & ((1 << width) - 1)).reshape(words.shape[0], -1)


def codes(p: PackedWeight) -> torch.Tensor:
    """The integer code ``q`` of every element, ``[R, K]`` int32 (before offset or table)."""
    qt = p.qtype
    assert qt is not None
    r, k = p.rows, p.cols
    if qt.byte:
        return p.planes["byte"].to(torch.int32)
    q = torch.zeros(r, k, dtype=torch.int32, device=p.device)
    low_bits = 0
    if qt.nib:
        nib = p.planes["nib"].view(r, k // 32, 1, 16)
        q = torch.cat([nib & 15, nib >> 4], dim=2).reshape(r, k).to(torch.int32)
        low_bits = 4
    if qt.pair:
        q = q | (_bits_of(p.planes["pair"], 2) << low_bits)
        low_bits += 2
    if qt.bit:
        q = q | (_bits_of(p.planes["bit"], 1) << low_bits)
    return q


def _values(p: PackedWeight, q: torch.Tensor) -> torch.Tensor:
    """``f(q)`` as float32: the code minus the type's offset, or its IQ4 table value."""
    if p.qtype.lut:
        table = torch.tensor(IQ4_VALUES, dtype=torch.float32, device=q.device)
        return table[q.long()]
    return (q - p.qtype.offset).to(torch.float32)


def group_scales(p: PackedWeight) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scale and min of every group, float32 ``[R, K / group]`` each (min None if the type
    has none), computed as ggml does: ``d * sub_scale``, ``dm * sub_min``."""
    qt = p.qtype
    per_block = qt.block // qt.group
    d = p.planes["d"].to(torch.float32).repeat_interleave(per_block, dim=1)
    scale, low_min = d, None
    if qt.scales == SCALE_SUB:
        scale = d * p.planes["sc"].to(torch.float32)
    elif qt.scales == SCALE_PACKED:
        scale = d * (p.planes["sc"] & 15).to(torch.float32)
    if qt.mins:
        dm = p.planes["dm"].to(torch.float32).repeat_interleave(per_block, dim=1)
        if qt.mins == MIN_BLOCK:
            low_min = dm
        elif qt.mins == MIN_SUB:
            low_min = dm * p.planes["mn"].to(torch.float32)
        elif qt.mins == MIN_PACKED:
            low_min = dm * (p.planes["sc"] >> 4).to(torch.float32)
    return scale, low_min


def dequantize_ref(p: PackedWeight) -> torch.Tensor:
    """The weight as float32 ``[rows, cols]`` (a dense weight: its values, widened)."""
    if p.qtype is None:
        return p.planes["dense"].to(torch.float32)
    qt = p.qtype
    r, k = p.rows, p.cols
    f = _values(p, codes(p)).view(r, k // qt.group, qt.group)
    scale, low_min = group_scales(p)
    w = scale.unsqueeze(-1) * f
    if low_min is not None:
        w = w - low_min.unsqueeze(-1)
    return w.reshape(r, k)


def dequantize_rows_ref(p: PackedWeight, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` of the weight as float32 ``[len(ids), cols]``, decoding only those rows."""
    return dequantize_ref(p.gather_rows(ids.reshape(-1).long()))


def linear_ref(x: torch.Tensor, parts: list[PackedWeight],
               bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T + bias`` with ``W`` the partitions stacked along the rows, decoded here, in
    x's dtype."""
    w = torch.cat([dequantize_ref(p) for p in parts]) if len(parts) > 1 else dequantize_ref(
        parts[0])
    return F.linear(x, w.to(x.dtype), bias)
