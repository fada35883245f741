"""GGML blocks → the planes the kernels read (converted once, at load).

GGML interleaves each block's scales with its codes, and several types scatter the bits of one
element over the block (Q4_K's nibbles cover 64 elements per 32 bytes, Q5_K/Q3_K keep high bits
as bit-columns, Q6_K splits a 6-bit code over two arrays). A :class:`PackedWeight` stores each
kind of field of a ``[rows, cols]`` weight as its own contiguous row-major tensor, in one
element order for every type:

=========  =====================  ====================================================
plane      dtype, shape           content
=========  =====================  ====================================================
``nib``    uint8 ``[R, K/2]``     4 bits per element; per 32 elements 16 bytes, byte j
                                  holding element j (low nibble) and 16+j (high nibble)
``pair``   int32 ``[R, K/16]``    2 bits per element; word w holds elements 16w..16w+15,
                                  element 16w+i at bits 2i, 2i+1
``bit``    int32 ``[R, K/32]``    1 bit per element; word w bit i is element 32w+i
``byte``   int8 ``[R, K]``        a signed 8-bit code per element (Q8_0)
``d``      fp16 ``[R, K/block]``  the block scale
``dm``     fp16 ``[R, K/block]``  the block min (negated for Q4_1/Q5_1: they add it)
``sc``     int8 ``[R, K/group]``  the group's sub-scale (uint8 packed scale|min for Q2_K)
``mn``     int8 ``[R, K/group]``  the group's sub-min (Q4_K, Q5_K)
=========  =====================  ====================================================

A program reading 32 elements of a row finds their codes in 16 contiguous bytes (plus one or
two words for the high bits) and their scales in one or two bytes, whatever the type, so one
kernel serves every type and loads wide, coalesced vectors. The planes cost the same bytes as
the GGML blocks, except where 6-bit sub-scales (and mins) are unpacked to bytes: Q4_K
(+2.8%), Q5_K (+2.3%), Q3_K (+3.6%), IQ4_XS (+1.5%).

Tensor parallelism: rows are independent, so a column-parallel shard is a range of whole rows;
a row-parallel shard is a range of whole blocks of every row (its bounds must be multiples of
the block size, 256 for k-quants). Both are cut from the GGML bytes before packing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from .qtypes import MIN_BLOCK, MIN_SUB, SCALE_PACKED, SCALE_SUB, QuantType, quant_type

#: rows converted per step, so that the per-element temporaries stay small
PACK_CHUNK_ROWS = 2048


@dataclass
class PackedWeight:
    """One ``[rows, cols]`` weight: GGML-typed planes (see the module docstring), or a dense
    float tensor (``qtype`` None, the plane ``"dense"``)."""

    qtype: QuantType | None
    rows: int
    cols: int
    planes: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def type_name(self) -> str:
        return self.qtype.name if self.qtype is not None else str(
            self.planes["dense"].dtype).replace("torch.", "")

    @property
    def device(self) -> torch.device:
        return next(iter(self.planes.values())).device

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.planes.values())

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "PackedWeight":
        """The weight whose planes are ``fn`` of these (each plane is indexed by rows first,
        so ``fn`` may select, reorder or add rows)."""
        planes = {k: fn(v) for k, v in self.planes.items()}
        return PackedWeight(self.qtype, next(iter(planes.values())).shape[0], self.cols, planes)

    def gather_rows(self, index: torch.Tensor) -> "PackedWeight":
        return self.map(lambda t: t.index_select(0, index))

    def pad_rows(self, n: int) -> "PackedWeight":
        """``n`` rows of zeros appended (every field zero decodes to 0 or -0)."""
        if n <= 0:
            return self
        return self.map(lambda t: torch.cat([t, t.new_zeros((n, *t.shape[1:]))]))

    def to(self, device: torch.device | str) -> "PackedWeight":
        return self.map(lambda t: t.to(device))


def dense(weight: torch.Tensor) -> PackedWeight:
    """A float weight that stays dense."""
    return PackedWeight(None, weight.shape[0], weight.shape[1], {"dense": weight.contiguous()})


def cat_rows(parts: list[PackedWeight]) -> PackedWeight:
    """Weights of one type stacked along the rows (the partitions of a merged layer)."""
    first = parts[0]
    if any(p.type_name != first.type_name or p.cols != first.cols
           or p.planes.keys() != first.planes.keys() for p in parts):
        raise ValueError("only weights of one type and width can be stacked")
    planes = {k: torch.cat([p.planes[k] for p in parts]) for k in first.planes}
    return PackedWeight(first.qtype, sum(p.rows for p in parts), first.cols, planes)


def pack(raw: torch.Tensor, qtype: str | QuantType, cols: int | None = None,
         chunk_rows: int = PACK_CHUNK_ROWS) -> PackedWeight:
    """Planes of ``raw``, GGML blocks of ``qtype`` as uint8 ``[rows, bytes per row]``, on
    ``raw``'s device. ``cols`` (elements per row) is checked against the byte count when given.
    """
    qt = qtype if isinstance(qtype, QuantType) else quant_type(qtype)
    if raw.dtype != torch.uint8 or raw.dim() != 2:
        raise ValueError(f"{qt.name}: expected GGML blocks as a 2-d uint8 tensor, got "
                         f"{raw.dtype} of shape {tuple(raw.shape)}")
    rows, nbytes = raw.shape
    if nbytes % qt.block_bytes:
        raise ValueError(f"{qt.name}: a row of {nbytes} bytes is not a whole number of "
                         f"{qt.block_bytes}-byte blocks")
    k = nbytes // qt.block_bytes * qt.block
    if cols is not None and cols != k:
        raise ValueError(f"{qt.name}: rows of {nbytes} bytes hold {k} elements, expected {cols}")
    planes = _empty_planes(qt, rows, k, raw.device)
    for start in range(0, rows, chunk_rows):
        stop = min(rows, start + chunk_rows)
        for name, value in _convert(raw[start:stop], qt).items():
            planes[name][start:stop] = value
    return PackedWeight(qt, rows, k, planes)


def _empty_planes(qt: QuantType, rows: int, k: int, device: torch.device
                  ) -> dict[str, torch.Tensor]:
    shapes: dict[str, tuple[torch.dtype, int]] = {"d": (torch.float16, k // qt.block)}
    if qt.nib:
        shapes["nib"] = (torch.uint8, k // 2)
    if qt.pair:
        shapes["pair"] = (torch.int32, k // 16)
    if qt.bit:
        shapes["bit"] = (torch.int32, k // 32)
    if qt.byte:
        shapes["byte"] = (torch.int8, k)
    if qt.mins:
        shapes["dm"] = (torch.float16, k // qt.block)
    if qt.scales == SCALE_SUB:
        shapes["sc"] = (torch.int8, k // qt.group)
    elif qt.scales == SCALE_PACKED:
        shapes["sc"] = (torch.uint8, k // qt.group)
    if qt.mins == MIN_SUB:
        shapes["mn"] = (torch.int8, k // qt.group)
    return {name: torch.empty(rows, width, dtype=dtype, device=device)
            for name, (dtype, width) in shapes.items()}


# -- field extraction ---------------------------------------------------------------------------
def _f16(b: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 at byte ``at`` of every block of ``b [R, nb, block_bytes]`` → ``[R, nb]``."""
    return b[..., at:at + 2].contiguous().view(torch.float16).reshape(b.shape[0], -1)


def _shifts(step: int, count: int, device: torch.device, dims: int) -> torch.Tensor:
    return (torch.arange(count, dtype=torch.uint8, device=device) * step).view(
        *([1] * (dims - 2)), count, 1)


def _bit_columns(src: torch.Tensor) -> torch.Tensor:
    """Elements ``32i + j`` ← bit ``i`` of ``src[..., j]``: ``[R, nb, 32]`` bytes →
    ``[R, nb*256]`` bits."""
    r, nb, _ = src.shape
    bits = (src.unsqueeze(2) >> _shifts(1, 8, src.device, 4)) & 1
    return bits.reshape(r, nb * 256)


def _pair_columns(src: torch.Tensor) -> torch.Tensor:
    """Elements ``128h + 32s + j`` ← bits ``2s`` of ``src[..., 32h + j]``: ``[R, nb, 64]``
    bytes → ``[R, nb*256]`` 2-bit codes."""
    r, nb, _ = src.shape
    pairs = (src.view(r, nb, 2, 1, 32) >> _shifts(2, 4, src.device, 5)) & 3
    return pairs.reshape(r, nb * 256)


def _nibble_halves(src: torch.Tensor, half: int) -> torch.Tensor:
    """Elements ``2*half*c + half*t + j`` ← nibble ``t`` of ``src[..., half*c + j]``: GGML's
    k-quant nibble order (``half`` 32 for Q4_K/Q5_K, 64 for Q6_K)."""
    r, nb, n = src.shape
    nib = (src.view(r, nb, n // half, 1, half) >> _shifts(4, 2, src.device, 5)) & 15
    return nib.reshape(r, nb * n * 2)


def _nib_plane(codes: torch.Tensor) -> torch.Tensor:
    """Natural-order 4-bit codes ``[R, K]`` → the ``nib`` plane."""
    r, k = codes.shape
    v = codes.view(r, k // 32, 2, 16)
    return (v[:, :, 0] | (v[:, :, 1] << 4)).reshape(r, k // 2)


def _packed_words(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Natural-order ``bits``-bit codes ``[R, K]`` → int32 words, element ``i`` of a word at
    bit ``bits * i`` (little-endian bytes, so the layout is the same on every device)."""
    r, k = codes.shape
    per_byte = 8 // bits
    v = codes.view(r, k // per_byte, per_byte)
    shifts = (torch.arange(per_byte, dtype=torch.uint8, device=codes.device) * bits)
    packed = (v << shifts).sum(dim=-1, dtype=torch.uint8)
    return packed.view(r, -1, 4).contiguous().view(torch.int32).reshape(r, -1)


def _convert(raw: torch.Tensor, qt: QuantType) -> dict[str, torch.Tensor]:
    r = raw.shape[0]
    b = raw.view(r, -1, qt.block_bytes)
    nb = b.shape[1]
    name = qt.name
    out: dict[str, torch.Tensor] = {}
    if name in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL"):
        out["d"] = _f16(b, 0)
        at = 2
        if qt.mins == MIN_BLOCK:  # Q4_1/Q5_1 add m: stored negated, the min is subtracted
            out["dm"] = -_f16(b, 2)
            at = 4
        if qt.bit:  # qh: bit j of a little-endian word is element j's fifth bit
            out["bit"] = b[..., at:at + 4].contiguous().view(torch.int32).reshape(r, nb)
            at += 4
        if qt.byte:
            out["byte"] = b[..., at:at + 32].contiguous().view(torch.int8).reshape(r, nb * 32)
        else:  # 16 bytes: low nibbles elements 0..15, high nibbles 16..31 (the plane's order)
            out["nib"] = b[..., at:at + 16].reshape(r, nb * 16)
    elif name in ("Q4_K", "Q5_K"):
        out["d"], out["dm"] = _f16(b, 0), _f16(b, 2)
        s = b[..., 4:16]
        lo, mid, hi = s[..., 0:4], s[..., 4:8], s[..., 8:12]
        out["sc"] = torch.cat([lo & 63, (hi & 15) | ((lo >> 2) & 0x30)], -1).view(
            torch.int8).reshape(r, nb * 8)
        out["mn"] = torch.cat([mid & 63, (hi >> 4) | ((mid >> 2) & 0x30)], -1).view(
            torch.int8).reshape(r, nb * 8)
        at = 16
        if qt.bit:
            out["bit"] = _packed_words(_bit_columns(b[..., 16:48]), 1)
            at = 48
        out["nib"] = _nib_plane(_nibble_halves(b[..., at:at + 128], 32))
    elif name == "Q6_K":
        out["nib"] = _nib_plane(_nibble_halves(b[..., 0:128], 64))
        out["pair"] = _packed_words(_pair_columns(b[..., 128:192]), 2)
        out["sc"] = b[..., 192:208].contiguous().view(torch.int8).reshape(r, nb * 16)
        out["d"] = _f16(b, 208)
    elif name == "Q2_K":
        out["sc"] = b[..., 0:16].reshape(r, nb * 16)
        out["pair"] = _packed_words(_pair_columns(b[..., 16:80]), 2)
        out["d"], out["dm"] = _f16(b, 80), _f16(b, 82)
    elif name == "Q3_K":
        out["bit"] = _packed_words(_bit_columns(b[..., 0:32]), 1)
        out["pair"] = _packed_words(_pair_columns(b[..., 32:96]), 2)
        s = b[..., 96:108]
        low = torch.cat([s[..., :8] & 15, s[..., :8] >> 4], -1)
        high = ((s[..., 8:12].unsqueeze(2) >> _shifts(2, 4, s.device, 4)) & 3).reshape(r, nb, 16)
        out["sc"] = ((low | (high << 4)).to(torch.int16) - 32).to(torch.int8).reshape(r, nb * 16)
        out["d"] = _f16(b, 108)
    elif name == "IQ4_XS":
        out["d"] = _f16(b, 0)
        high_word = b[..., 2:4].contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
        shifts = torch.arange(8, dtype=torch.int32, device=b.device) * 2
        high = (high_word >> shifts) & 3  # [R, nb, 8]
        low = ((b[..., 4:8].unsqueeze(-1) >> _shifts(4, 2, b.device, 3).view(1, 1, 1, 2)) & 15)
        low = low.reshape(r, nb, 8).to(torch.int32)
        out["sc"] = ((low | (high << 4)) - 32).to(torch.int8).reshape(r, nb * 8)
        out["nib"] = b[..., 8:136].reshape(r, nb * 128)
    else:  # pragma: no cover - the type table and this function list the same types
        raise AssertionError(name)
    return out
