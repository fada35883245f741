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


def _natural(slotted: torch.Tensor) -> torch.Tensor:
    """``[R, C, words, slots]`` codes (slot ``s`` of word ``u`` is element ``words * s + u`` of
    chunk ``C``) → natural order ``[R, C * 32]``."""
    return slotted.transpose(2, 3).reshape(slotted.shape[0], -1)


def _unpack(plane: torch.Tensor, words: int, width: int) -> torch.Tensor:
    """A code plane → its fields of ``width`` bits in natural order, uint8 ``[R, K]``: each
    chunk is ``words`` little-endian fields-words (see :mod:`tallow_quant_gguf.packing`)."""
    as_bytes = plane.contiguous().view(torch.uint8)
    r = as_bytes.shape[0]
    per_byte = 8 // width
    shifts = torch.arange(per_byte, dtype=torch.uint8, device=plane.device) * width
    fields = (as_bytes.unsqueeze(-1) >> shifts) & ((1 << width) - 1)  # [R, bytes, per_byte]
    return _natural(fields.reshape(r, -1, words, 32 // words))


def codes(p: PackedWeight) -> torch.Tensor:
    """The integer code ``q`` of every element, uint8 ``[R, K]``, before the offset or table
    (Q8_0's codes are the stored ``q + 128``)."""
    qt = p.qtype
    assert qt is not None
    if qt.byte:
        return _unpack(p.planes["byte"], 8, 8)
    q: torch.Tensor | None = None
    if qt.nib:
        q = _unpack(p.planes["nib"], 4, 4)
    if qt.pair:
        pair = _unpack(p.planes["pair"], 4, 2)
        q = pair if q is None else q | (pair << 4)
    if qt.bit:
        q = q | (_unpack(p.planes["bit"], 4, 1) << (4 if qt.nib else 2))
    return q


def _values(p: PackedWeight, q: torch.Tensor) -> torch.Tensor:
    """``f(q)`` as a fresh float32 tensor: the code minus the type's offset, or its IQ4 table
    value."""
    if p.qtype.lut:
        table = torch.tensor(IQ4_VALUES, dtype=torch.float32, device=q.device)
        return table[q.long()]
    f = q.to(torch.float32)
    if p.qtype.offset:
        f -= p.qtype.offset  # exact: small integers
    return f


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
    w = _values(p, codes(p)).view(r, k // qt.group, qt.group)
    scale, low_min = group_scales(p)
    w *= scale.unsqueeze(-1)  # in place, the same products as ``scale * f``
    if low_min is not None:
        w -= low_min.unsqueeze(-1)
    return w.view(r, k)


def dequantize_rows_ref(p: PackedWeight, ids: torch.Tensor) -> torch.Tensor:
    """Rows ``ids`` of the weight as float32 ``[len(ids), cols]``, decoding only those rows."""
    return dequantize_ref(p.gather_rows(ids.reshape(-1).long()))


def linear_ref(
    x: torch.Tensor, parts: list[PackedWeight], bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``x @ W.T + bias`` with ``W`` the partitions stacked along the rows, decoded here, in
    x's dtype."""
    w = (
        torch.cat([dequantize_ref(p) for p in parts])
        if len(parts) > 1
        else dequantize_ref(parts[0])
    )
    return F.linear(x, w.to(x.dtype), bias)
