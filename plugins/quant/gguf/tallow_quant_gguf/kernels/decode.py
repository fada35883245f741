"""Decoding packed planes inside a Triton kernel, shared by every kernel of the plugin.

The unit of every kernel is the *quad*: 4 consecutive int32 words (16 bytes) of codes, one
32-element chunk of a 4-bit (or narrower) type, half a chunk of an 8-bit one (see
:mod:`tallow_quant_gguf.packing`). A tile is ``BN`` rows by ``Q`` quads by the 4 words, and every
plane of a tile is loaded in that ``[BN, Q, 4]`` shape with its 4 values contiguous: each
thread gets a quad of a row in one 16-byte vector load (and the matching 8-byte, 4-byte or
2-byte vectors of the narrower planes), so every plane, every decoded slot and the matching
activations share one register layout and no kernel moves data between lanes while it decodes.

A quad holds ``SLOTS`` slots (8 nibbles per word, or 4 bytes); slot ``s`` of the tile is the
``[BN, Q, 4]`` tensor of its 4 consecutive elements per quad (:func:`slot_columns` gives their
columns). :func:`slot_code` extracts a slot's integer codes, :func:`group_scales` the scale and
min of a group from the fields :func:`load_group_fields` loads (a group is a whole chunk, or for
16-element groups the chunk's first or second half of the slots). The float operations are
ggml's, in ggml's order (``d * sc``, ``* f(q)``, ``- dm * mn``); compiled without fused
multiply-adds the values are the bits of the torch reference.

The type is a set of ``tl.constexpr`` flags (:func:`type_constants`), so each type compiles to
straight-line code for exactly its planes.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import triton
import triton.language as tl

from ..packing import PackedWeight
from ..qtypes import IQ4_VALUES

_PLANES = ("nib", "pair", "bit", "byte", "d", "dm", "sc", "mn")
_LUTS: dict[torch.device, torch.Tensor] = {}


def type_constants(p: PackedWeight) -> dict[str, Any]:
    """The ``tl.constexpr`` arguments describing ``p``'s type to the kernels."""
    qt = p.qtype
    return dict(
        NIB=qt.nib,
        PAIR=qt.pair,
        BIT=qt.bit,
        BYTE=qt.byte,
        OFFSET=qt.offset,
        LUT=qt.lut,
        GROUP=qt.group,
        QBLOCK=qt.block,
        SCALES=qt.scales,
        MINS=qt.mins,
    )


def quads_per_chunk(p: PackedWeight) -> int:
    """Quads (16 bytes of codes) per 32-element chunk: 2 for 8-bit codes, else 1."""
    return 2 if p.qtype.byte else 1


def plane_args(p: PackedWeight) -> tuple[list[torch.Tensor], list[int]]:
    """The plane pointers (absent planes: any tensor, never read) and the row strides of the
    nib, pair, bit, byte, d and sc planes, in the kernels' order; the lookup table of the IQ4
    types is the last pointer."""
    planes = p.planes
    some = planes["d"]
    ptrs = [planes.get(name, some) for name in _PLANES]
    strides = [
        planes[name].stride(0) if name in planes else 0
        for name in ("nib", "pair", "bit", "byte", "d", "sc")
    ]
    return ptrs + [iq4_table(some.device)], strides


def per_device(
    cache: dict, device: torch.device, make: Callable[[], torch.Tensor], what: str
) -> torch.Tensor:
    """``cache[device]``, made by ``make()`` the first time: before any CUDA-graph capture (the
    engine runs each shape eagerly first, and ``ops.warm_up`` makes them at load), since an
    allocation inside a capture would belong to the graph."""
    buf = cache.get(device)
    if buf is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                f"tallow-quant-gguf: the {what} of {device} was first needed "
                "inside a CUDA-graph capture; run the kernels once eagerly first"
            )
        buf = cache[device] = make()
    return buf


def iq4_table(device: torch.device) -> torch.Tensor:
    """The IQ4 value table on ``device``, made once per device."""
    return per_device(
        _LUTS,
        device,
        lambda: torch.tensor(IQ4_VALUES, dtype=torch.float32, device=device),
        "IQ4 table",
    )


@triton.jit
def quad_range(pid_k, quads_per_split, K, BYTE: tl.constexpr):
    """The quads ``[begin, end)`` of K slice ``pid_k``."""
    begin = pid_k * quads_per_split
    return begin, tl.minimum(begin + quads_per_split, (K // 32) * (2 if BYTE else 1))


@triton.jit
def load_codes(
    nib_ptr,
    pair_ptr,
    bit_ptr,
    byte_ptr,
    r3,
    quads3,
    u3,
    mask3,
    s_nib,
    s_pair,
    s_bit,
    s_byte,
    NIB: tl.constexpr,
    PAIR: tl.constexpr,
    BIT: tl.constexpr,
    BYTE: tl.constexpr,
    MASKED: tl.constexpr,
):
    """The code planes of a tile: row indices ``r3``, quads ``quads3`` and words ``u3`` that
    broadcast to the tile's shape (``[BN, Q, 4]``, or ``[entries, 4]``); int32 tensors (a
    scalar zero for the planes the type lacks). With ``MASKED`` the entries outside ``mask3``
    read as zero; without it they are not read and hold anything (callers never use them)."""
    nib = 0
    pair = 0
    bit = 0
    byte = 0
    at = quads3 * 4 + u3
    if BYTE:
        byte = _load(byte_ptr + r3 * s_byte + at, mask3, MASKED)
    if NIB:
        nib = _load(nib_ptr + r3 * s_nib + at, mask3, MASKED)
    if PAIR:
        pair = _load(pair_ptr + r3 * s_pair + at, mask3, MASKED).to(tl.int32)
    if BIT:
        bit = _load(bit_ptr + r3 * s_bit + at, mask3, MASKED).to(tl.int32)
    return nib, pair, bit, byte


@triton.jit
def load_code_tile(
    nib_ptr,
    pair_ptr,
    bit_ptr,
    byte_ptr,
    rows,
    row_mask,
    q0,
    q_end,
    s_nib,
    s_pair,
    s_bit,
    s_byte,
    BN: tl.constexpr,
    Q: tl.constexpr,
    NIB: tl.constexpr,
    PAIR: tl.constexpr,
    BIT: tl.constexpr,
    BYTE: tl.constexpr,
    EVEN: tl.constexpr,
):
    """The code planes of rows ``rows [BN]`` and quads ``q0 .. q0 + Q`` as ``[BN, Q, 4]``
    int32 tiles. Each is loaded as a ``[BN, 4Q]`` row-major tile, whose words are contiguous
    along the rows of the tile, so that every Triton version lays it out the same way (16-byte
    vectors, whole quads in each thread) before the view as quads. ``EVEN``: whole tiles, no
    masks."""
    col = q0 * 4 + tl.arange(0, 4 * Q)
    if EVEN:
        mask = None
    else:
        mask = row_mask[:, None] & (col < q_end * 4)[None, :]
    nib, pair, bit, byte = load_codes(
        nib_ptr,
        pair_ptr,
        bit_ptr,
        byte_ptr,
        rows[:, None],
        0,
        col[None, :],
        mask,
        s_nib,
        s_pair,
        s_bit,
        s_byte,
        NIB,
        PAIR,
        BIT,
        BYTE,
        not EVEN,
    )
    if BYTE:
        byte = tl.reshape(byte, (BN, Q, 4))
    if NIB:
        nib = tl.reshape(nib, (BN, Q, 4))
    if PAIR:
        pair = tl.reshape(pair, (BN, Q, 4))
    if BIT:
        bit = tl.reshape(bit, (BN, Q, 4))
    return nib, pair, bit, byte


@triton.jit
def _load(ptr, mask, MASKED: tl.constexpr):
    if MASKED:
        v = tl.load(ptr, mask=mask, other=0)
    else:
        v = tl.load(ptr, mask=mask)
    return v


@triton.jit
def slot_columns(quads3, u3, S: tl.constexpr, BYTE: tl.constexpr):
    """Columns of slot ``S``'s elements in a ``[1, Q, 4]`` tile of quads: 4 consecutive
    columns per quad."""
    if BYTE:  # 2 quads per chunk; byte S of word u of the chunk is element 8S + u
        col = 32 * (quads3 // 2) + 4 * (quads3 % 2) + 8 * S + u3
    else:
        col = 32 * quads3 + 4 * S + u3
    return col


@triton.jit
def slot_code(
    nib,
    pair,
    bit,
    byte,
    S: tl.constexpr,
    NIB: tl.constexpr,
    PAIR: tl.constexpr,
    BIT: tl.constexpr,
    BYTE: tl.constexpr,
):
    """The integer codes ``q`` of slot ``S`` (int32, the tile's shape; slots ``0..3`` of a
    byte quad, ``0..7`` of the others)."""
    if BYTE:
        q = (byte >> (8 * S)) & 0xFF
    else:
        if NIB:
            q = (nib >> (4 * S)) & 15
            if PAIR:
                q = q | (((pair >> (2 * S)) & 3) << 4)
        else:
            q = (pair >> (2 * S)) & 3
        if BIT:
            q = q | (((bit >> S) & 1) << (4 if NIB else 2))
    return q


@triton.jit
def slot_values(q, lut_ptr, OFFSET: tl.constexpr, LUT: tl.constexpr):
    """``f(q)`` in float32: the code minus the type's offset, or its IQ4 table value."""
    if LUT:
        f = tl.load(lut_ptr + q)
    else:
        f = (q - OFFSET).to(tl.float32)
    return f


@triton.jit
def load_group_fields(
    d_ptr,
    dm_ptr,
    sc_ptr,
    mn_ptr,
    r2,
    chunks2,
    mask2,
    s_d,
    s_sc,
    GROUP: tl.constexpr,
    QBLOCK: tl.constexpr,
    SCALES: tl.constexpr,
    MINS: tl.constexpr,
    MASKED: tl.constexpr,
):
    """The scale fields of a ``[BN, Q]`` tile as stored: ``(d, dm, sc0, sc1, mn)`` for row
    offsets ``r2 [BN, 1]`` and the chunks ``chunks2 [1, Q]`` of the tile's quads; ``sc0`` and
    ``sc1`` are the sub-scales of the chunk's two 16-element groups (the same byte when
    ``GROUP`` is 32). Fields the type lacks are scalar zeros; ``MASKED`` as for
    :func:`load_codes`. Loaded apart from :func:`group_scales` so that a kernel can issue the
    loads of its next tile before it uses them."""
    if GROUP == 16:
        grp = 2 * chunks2
    else:
        grp = chunks2
    blk = (chunks2 * 32) // QBLOCK
    d = _load(d_ptr + r2 * s_d + blk, mask2, MASKED)
    dm = 0.0
    sc0 = 0
    sc1 = 0
    mn = 0
    if SCALES != 0:
        sc0 = _load(sc_ptr + r2 * s_sc + grp, mask2, MASKED)
        sc1 = sc0
        if GROUP == 16:
            sc1 = _load(sc_ptr + r2 * s_sc + grp + 1, mask2, MASKED)
    if MINS != 0:
        dm = _load(dm_ptr + r2 * s_d + blk, mask2, MASKED)
    if MINS == 2:
        mn = _load(mn_ptr + r2 * s_sc + grp, mask2, MASKED)
    return d, dm, sc0, sc1, mn


@triton.jit
def group_scales(d, dm, sc, mn, SCALES: tl.constexpr, MINS: tl.constexpr):
    """Scale and min (float32) of a group from its fields (:func:`load_group_fields`; ``sc``
    the group's sub-scale byte): ``d * sc`` and ``dm * mn`` as ggml forms them. The min is
    meaningless when the type has none (``MINS == 0``)."""
    d = d.to(tl.float32)
    scale = d
    low_min = d
    if SCALES == 1:
        scale = d * sc.to(tl.float32)
    if SCALES == 2:  # Q2_K: a byte per 16 elements, low nibble scale, high nibble min
        packed = sc.to(tl.int32)
        scale = d * (packed & 15).to(tl.float32)
    if MINS != 0:
        dm = dm.to(tl.float32)
        low_min = dm
        if MINS == 2:
            low_min = dm * mn.to(tl.float32)
        if MINS == 3:
            low_min = dm * (packed >> 4).to(tl.float32)
    return scale, low_min


@triton.jit
def slot_weights(
    nib,
    pair,
    bit,
    byte,
    lut_ptr,
    scale,
    low_min,
    S: tl.constexpr,
    NIB: tl.constexpr,
    PAIR: tl.constexpr,
    BIT: tl.constexpr,
    BYTE: tl.constexpr,
    OFFSET: tl.constexpr,
    LUT: tl.constexpr,
    MINS: tl.constexpr,
):
    """The decoded weights of slot ``S`` in float32: ``scale * f(q) - low_min``, ``scale`` and
    ``low_min`` being the ``[BN, G]`` values of the slot's group."""
    q = slot_code(nib, pair, bit, byte, S, NIB, PAIR, BIT, BYTE)
    w = scale[:, :, None] * slot_values(q, lut_ptr, OFFSET, LUT)
    if MINS != 0:
        w = w - low_min[:, :, None]
    return w
