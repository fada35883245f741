"""GGML blocks → the planes the kernels read (converted once, at load).

GGML interleaves each block's scales with its codes, and several types scatter the bits of one
element over the block (Q4_K's nibbles cover 64 elements per 32 bytes, Q5_K/Q3_K keep high bits
as bit-columns, Q6_K splits a 6-bit code over two arrays). A :class:`PackedWeight` stores each
kind of field of a ``[rows, cols]`` weight as its own contiguous row-major tensor:

=========  =====================  ====================================================
plane      dtype, shape           content
=========  =====================  ====================================================
``nib``    int32 ``[R, K/8]``     4 bits per element (the code's low bits)
``pair``   int16 ``[R, K/8]``     2 bits per element (bits 4-5 of Q6_K, the code of
                                  Q2_K and Q3_K)
``bit``    uint8 ``[R, K/8]``     1 bit per element (bit 4 of the 5-bit types, bit 2
                                  of Q3_K)
``byte``   int32 ``[R, K/4]``     an 8-bit code per element, stored as ``q + 128``
                                  (unsigned, Q8_0: ``OFFSET`` 128 takes it back)
``d``      fp16 ``[R, K/block]``  the block scale
``dm``     fp16 ``[R, K/block]``  the block min (negated for Q4_1/Q5_1: they add it)
``sc``     int8 ``[R, K/group]``  the group's sub-scale (uint8 packed scale|min for Q2_K)
``mn``     int8 ``[R, K/group]``  the group's sub-min (Q4_K, Q5_K)
=========  =====================  ====================================================

**Slot order.** Every 32 consecutive elements of a row (a *chunk*; every group and block is
a whole number of chunks or halves of one) are stored transposed: for the 4-bit codes the
chunk is 4 int32 words, and nibble ``s`` (bits ``4s..4s+3``) of word ``u`` holds element
``4s + u``. So one 16-byte vector load gives a thread the whole chunk, and the elements of
one *slot* ``s`` across the 4 words are 4 consecutive elements of the row: the kernels decode
slot by slot and multiply each slot by 4 consecutive activations (one 8-byte load), never
moving codes between lanes. The other planes follow the same order so that each lines up
with the nibbles: the ``pair`` plane has one int16 per word ``u`` (bits ``2s, 2s+1`` for
slot ``s``), the ``bit`` plane one byte per word ``u`` (bit ``s``). The 8-bit codes (Q8_0)
take 8 words per chunk: byte ``b`` of word ``u`` holds element ``8b + u`` (4 slots of 8
consecutive elements). Slots ``0..3`` are the chunk's first 16 elements, ``4..7`` the last
16, so a 16-element group (Q6_K, Q3_K, Q2_K) is half the slots.

The planes cost the same bytes as the GGML blocks, except where 6-bit sub-scales (and mins)
are unpacked to bytes: Q4_K (+2.8%), Q5_K (+2.3%), Q3_K (+3.6%), IQ4_XS (+1.5%).

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
        return (
            self.qtype.name
            if self.qtype is not None
            else str(self.planes["dense"].dtype).replace("torch.", "")
        )

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
    if any(
        p.type_name != first.type_name
        or p.cols != first.cols
        or p.planes.keys() != first.planes.keys()
        for p in parts
    ):
        raise ValueError("only weights of one type and width can be stacked")
    planes = {k: torch.cat([p.planes[k] for p in parts]) for k in first.planes}
    return PackedWeight(first.qtype, sum(p.rows for p in parts), first.cols, planes)


def pack(
    raw: torch.Tensor,
    qtype: str | QuantType,
    cols: int | None = None,
    chunk_rows: int = PACK_CHUNK_ROWS,
) -> PackedWeight:
    """Planes of ``raw``, GGML blocks of ``qtype`` as uint8 ``[rows, bytes per row]``, on
    ``raw``'s device. ``cols`` (elements per row) is checked against the byte count when given.
    """
    qt = qtype if isinstance(qtype, QuantType) else quant_type(qtype)
    if raw.dtype != torch.uint8 or raw.dim() != 2:
        raise ValueError(
            f"{qt.name}: expected GGML blocks as a 2-d uint8 tensor, got "
            f"{raw.dtype} of shape {tuple(raw.shape)}"
        )
    rows, nbytes = raw.shape
    if nbytes % qt.block_bytes:
        raise ValueError(
            f"{qt.name}: a row of {nbytes} bytes is not a whole number of "
            f"{qt.block_bytes}-byte blocks"
        )
    k = nbytes // qt.block_bytes * qt.block
    if cols is not None and cols != k:
        raise ValueError(f"{qt.name}: rows of {nbytes} bytes hold {k} elements, expected {cols}")
    planes = _empty_planes(qt, rows, k, raw.device)
    for start in range(0, rows, chunk_rows):
        stop = min(rows, start + chunk_rows)
        for name, value in _convert(raw[start:stop], qt).items():
            planes[name][start:stop] = value
    return PackedWeight(qt, rows, k, planes)


def _empty_planes(
    qt: QuantType, rows: int, k: int, device: torch.device
) -> dict[str, torch.Tensor]:
    shapes: dict[str, tuple[torch.dtype, int]] = {"d": (torch.float16, k // qt.block)}
    if qt.nib:
        shapes["nib"] = (torch.int32, k // 8)
    if qt.pair:
        shapes["pair"] = (torch.int16, k // 8)
    if qt.bit:
        shapes["bit"] = (torch.uint8, k // 8)
    if qt.byte:
        shapes["byte"] = (torch.int32, k // 4)
    if qt.mins:
        shapes["dm"] = (torch.float16, k // qt.block)
    if qt.scales == SCALE_SUB:
        shapes["sc"] = (torch.int8, k // qt.group)
    elif qt.scales == SCALE_PACKED:
        shapes["sc"] = (torch.uint8, k // qt.group)
    if qt.mins == MIN_SUB:
        shapes["mn"] = (torch.int8, k // qt.group)
    return {
        name: torch.empty(rows, width, dtype=dtype, device=device)
        for name, (dtype, width) in shapes.items()
    }


# -- field extraction ---------------------------------------------------------------------------
def _f16(b: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 at byte ``at`` of every block of ``b [R, nb, block_bytes]`` → ``[R, nb]``."""
    return b[..., at : at + 2].contiguous().view(torch.float16).reshape(b.shape[0], -1)


def _shifts(step: int, count: int, device: torch.device, dims: int) -> torch.Tensor:
    return (torch.arange(count, dtype=torch.uint8, device=device) * step).view(
        *([1] * (dims - 2)), count, 1
    )


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


def _halves(src: torch.Tensor) -> torch.Tensor:
    """GGML's 32-element nibble order (byte ``j`` holds element ``j`` low, ``16 + j`` high)
    ``[R, nb, 16n]`` bytes → natural-order 4-bit codes ``[R, nb * 32n]``."""
    r, nb, n = src.shape
    v = src.view(r, nb, n // 16, 1, 16)
    return torch.cat([v & 15, v >> 4], dim=3).reshape(r, nb * n * 2)


def _slots(codes: torch.Tensor, per_chunk_words: int) -> torch.Tensor:
    """Natural-order codes ``[R, K]`` → ``[R, K/32, words, slots]``: the codes each word of a
    chunk holds, slot by slot (slot ``s`` of word ``u`` is element ``words * s + u``)."""
    r, k = codes.shape
    slots = 32 // per_chunk_words
    return codes.view(r, k // 32, slots, per_chunk_words).transpose(2, 3).contiguous()


def _nib_words(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes ``[R, K]`` → the ``nib`` plane: nibble ``s`` of word ``u`` is element
    ``4s + u`` of its chunk (little-endian bytes: byte ``b`` holds slots ``2b``, ``2b+1``)."""
    v = _slots(codes, 4)  # [R, C, 4 words, 8 slots]
    packed = v[..., 0::2] | (v[..., 1::2] << 4)  # [R, C, 4, 4 bytes]
    return packed.contiguous().view(torch.int32).reshape(codes.shape[0], -1)


def _byte_words(codes: torch.Tensor) -> torch.Tensor:
    """8-bit codes (uint8) ``[R, K]`` → the ``byte`` plane: byte ``b`` of word ``u`` is element
    ``8b + u`` of its chunk."""
    v = _slots(codes, 8)  # [R, C, 8 words, 4 slots]
    return v.view(torch.int32).reshape(codes.shape[0], -1)


def _pair_halves(codes: torch.Tensor) -> torch.Tensor:
    """2-bit codes ``[R, K]`` → the ``pair`` plane: bits ``2s, 2s+1`` of int16 ``u`` are
    element ``4s + u`` of its chunk."""
    v = _slots(codes, 4)  # [R, C, 4, 8 slots]
    shifts = torch.arange(4, dtype=torch.uint8, device=codes.device) * 2
    packed = (v.view(*v.shape[:3], 2, 4) << shifts).sum(dim=-1, dtype=torch.uint8)
    return packed.contiguous().view(torch.int16).reshape(codes.shape[0], -1)


def _bit_bytes(codes: torch.Tensor) -> torch.Tensor:
    """1-bit codes ``[R, K]`` → the ``bit`` plane: bit ``s`` of byte ``u`` is element
    ``4s + u`` of its chunk."""
    v = _slots(codes, 4)  # [R, C, 4, 8 slots]
    shifts = torch.arange(8, dtype=torch.uint8, device=codes.device)
    return (v << shifts).sum(dim=-1, dtype=torch.uint8).reshape(codes.shape[0], -1)


def _code_planes(
    low4: torch.Tensor | None, pair: torch.Tensor | None, bit: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    if low4 is not None:
        out["nib"] = _nib_words(low4)
    if pair is not None:
        out["pair"] = _pair_halves(pair)
    if bit is not None:
        out["bit"] = _bit_bytes(bit)
    return out


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
        bit = None
        if qt.bit:  # qh: bit j of a little-endian word is element j's fifth bit
            words = b[..., at : at + 4].contiguous().view(torch.int32)  # [R, nb, 1]
            bit = (
                ((words >> torch.arange(32, dtype=torch.int32, device=b.device)) & 1)
                .to(torch.uint8)
                .reshape(r, nb * 32)
            )
            at += 4
        if qt.byte:  # signed bytes stored as q + 128: the xor flips the sign bit
            codes = (b[..., at : at + 32] ^ 0x80).reshape(r, nb * 32)
            out["byte"] = _byte_words(codes)
        else:
            out.update(_code_planes(_halves(b[..., at : at + 16]), None, bit))
    elif name in ("Q4_K", "Q5_K"):
        out["d"], out["dm"] = _f16(b, 0), _f16(b, 2)
        s = b[..., 4:16]
        lo, mid, hi = s[..., 0:4], s[..., 4:8], s[..., 8:12]
        out["sc"] = (
            torch.cat([lo & 63, (hi & 15) | ((lo >> 2) & 0x30)], -1)
            .view(torch.int8)
            .reshape(r, nb * 8)
        )
        out["mn"] = (
            torch.cat([mid & 63, (hi >> 4) | ((mid >> 2) & 0x30)], -1)
            .view(torch.int8)
            .reshape(r, nb * 8)
        )
        at, bit = 16, None
        if qt.bit:
            bit = _bit_columns(b[..., 16:48])
            at = 48
        out.update(_code_planes(_nibble_halves(b[..., at : at + 128], 32), None, bit))
    elif name == "Q6_K":
        out.update(
            _code_planes(_nibble_halves(b[..., 0:128], 64), _pair_columns(b[..., 128:192]), None)
        )
        out["sc"] = b[..., 192:208].contiguous().view(torch.int8).reshape(r, nb * 16)
        out["d"] = _f16(b, 208)
    elif name == "Q2_K":
        out["sc"] = b[..., 0:16].reshape(r, nb * 16)
        out.update(_code_planes(None, _pair_columns(b[..., 16:80]), None))
        out["d"], out["dm"] = _f16(b, 80), _f16(b, 82)
    elif name == "Q3_K":
        out.update(_code_planes(None, _pair_columns(b[..., 32:96]), _bit_columns(b[..., 0:32])))
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
        low = (b[..., 4:8].unsqueeze(-1) >> _shifts(4, 2, b.device, 3).view(1, 1, 1, 2)) & 15
        low = low.reshape(r, nb, 8).to(torch.int32)
        out["sc"] = ((low | (high << 4)) - 32).to(torch.int8).reshape(r, nb * 8)
        out.update(_code_planes(_halves(b[..., 8:136]), None, None))
    else:  # pragma: no cover - the type table and this function list the same types
        raise AssertionError(name)
    return out
