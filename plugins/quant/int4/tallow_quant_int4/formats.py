"""The checkpoint layouts of integer weights, each unpacked to plain arrays and packed back.

Every unpacker returns :class:`Unpacked`: unsigned codes ``[N, K]`` (output rows by input
columns, uint8), scales ``[N, groups]``, zero points ``[N, groups]`` (uint8, in the codes'
unsigned domain) and, for GPTQ's act-order, the group of each input column. The weight is
``scale * (code - zero)``. The packers write the same tensors as the tools that make such
checkpoints (they build the test checkpoints; the tests check the unpackers against
independent implementations).

- **GPTQ** (AutoGPTQ, GPTQModel, optimum): ``qweight`` int32 ``[K * bits / 32, N]``, input
  column ``k`` in bits ``bits * (k % (32 / bits))`` of word ``k // (32 / bits)``; ``qzeros``
  int32 ``[groups, N * bits / 32]`` packed the same way along N; ``scales`` ``[groups, N]``;
  ``g_idx`` int32 ``[K]``, each column's group. Format ``gptq`` (v1) stores each zero point
  minus one (its kernels add the one back), ``gptq_v2`` the zero point itself.
- **AWQ** (AutoAWQ's GEMM version): ``qweight`` int32 ``[K, N / 8]`` packed along N with the
  interleaved order: nibble ``i`` of word ``j`` is output column ``8j + [0,2,4,6,1,3,5,7][i]``;
  ``qzeros`` int32 ``[groups, N / 8]`` the same; ``scales`` ``[groups, N]``.
- **compressed-tensors** ``pack-quantized``: ``weight_packed`` int32 ``[N, K * bits / 32]``,
  column ``k`` in bits ``bits * (k % (32 / bits))`` of word ``k // (32 / bits)``, each value
  stored plus ``2 ** (bits - 1)`` (signed values made unsigned); ``weight_scale``
  ``[N, groups]``; ``weight_zero_point`` (asymmetric only; signed, ``[N, groups]`` or packed
  along N like the codes, ``[N * bits / 32, groups]``); ``weight_g_idx`` (act-order).
- **Marlin** (IST-DASLab's Marlin, AutoGPTQ's ``is_marlin_format``, ``quant_method: marlin``):
  4-bit symmetric, ``B`` int32 ``[K / 16, 2 N]``: the ``[K, N]`` codes cut into 16 × 16 tiles
  laid row after row, each run of 1024 codes permuted for the tensor-core fragments of the
  ``mma.m16n8k16`` instruction, 8 per word; ``s`` ``[groups, N]`` float16 with each run of 64
  (per-channel: 32) columns permuted. See :func:`marlin_permutations`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


@dataclass(frozen=True)
class Unpacked:
    """A checkpoint weight as plain arrays (see the module docstring)."""

    codes: torch.Tensor  # uint8 [N, K]
    scales: torch.Tensor  # [N, groups]
    zeros: torch.Tensor | None  # uint8 [N, groups]; None: symmetric (2 ** (bits - 1))
    bits: int
    group_index: torch.Tensor | None = None  # [K]: each column's group (act-order)

    def symmetric_if_possible(self) -> "Unpacked":
        """The same weight with ``zeros`` None when every zero point is the midpoint."""
        if self.zeros is not None and bool((self.zeros == 1 << (self.bits - 1)).all()):
            return Unpacked(self.codes, self.scales, None, self.bits, self.group_index)
        return self


def _bits_from(packed: int, unpacked: int, what: str) -> int:
    """The code width for ``unpacked`` values packed into ``packed`` int32 words."""
    if unpacked <= 0 or (packed * 32) % unpacked:
        raise ValueError(f"{what}: {packed} words cannot hold {unpacked} codes")
    bits = packed * 32 // unpacked
    if bits not in (4, 8):
        raise ValueError(f"{what}: {bits}-bit codes are not supported (expected 4 or 8)")
    return bits


def _unpack_along(words: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Codes packed little-endian along ``dim`` of int32 ``words``: value ``i`` of a word is
    bits ``bits * i`` and up; returns uint8 with ``dim`` multiplied by ``32 / bits``."""
    per = 32 // bits
    shifts = torch.arange(per, device=words.device, dtype=torch.int32) * bits
    w = words.to(torch.int32).movedim(dim, -1)
    codes = (w[..., None] >> shifts) & ((1 << bits) - 1)
    return codes.reshape(*w.shape[:-1], w.shape[-1] * per).to(torch.uint8).movedim(-1, dim)


def _pack_along(codes: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """The inverse of :func:`_unpack_along`."""
    per = 32 // bits
    c = codes.to(torch.int64).movedim(dim, -1)
    c = c.reshape(*c.shape[:-1], c.shape[-1] // per, per)
    shifts = torch.arange(per, device=codes.device, dtype=torch.int64) * bits
    words = (c << shifts).sum(dim=-1)
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32).movedim(-1, dim).contiguous()


# -- GPTQ ------------------------------------------------------------------------------------
def unpack_gptq(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    g_idx: torch.Tensor | None,
    shape: tuple[int, int],
    *,
    zero_offset: int,
    what: str = "gptq",
) -> Unpacked:
    """GPTQ tensors of a weight of logical ``shape`` (N, K) → :class:`Unpacked`;
    ``zero_offset`` is 1 for format ``gptq`` (v1), 0 for ``gptq_v2``."""
    n, k = shape
    bits = _bits_from(qweight.shape[0], k, f"{what}: qweight")
    groups = scales.shape[0]
    if qweight.shape[1] != n or scales.shape[1] != n:
        raise ValueError(
            f"{what}: qweight {tuple(qweight.shape)} and scales "
            f"{tuple(scales.shape)} must have {n} output columns"
        )
    codes = _unpack_along(qweight, bits, 0).T.contiguous()  # [N, K]
    zeros = _unpack_along(qzeros, bits, 1)
    if tuple(zeros.shape) != (groups, n):
        raise ValueError(
            f"{what}: qzeros of shape {tuple(qzeros.shape)} does not hold "
            f"{groups} x {n} {bits}-bit zero points"
        )
    zeros = (zeros.to(torch.int16) + zero_offset).T.contiguous()
    if int(zeros.max()) > 255:
        raise ValueError(f"{what}: a zero point does not fit a byte")
    if g_idx is not None and tuple(g_idx.shape) != (k,):
        raise ValueError(f"{what}: g_idx has shape {tuple(g_idx.shape)}, expected ({k},)")
    return Unpacked(
        codes,
        scales.T.contiguous(),
        zeros.to(torch.uint8),
        bits,
        None if g_idx is None else g_idx.to(torch.int64),
    ).symmetric_if_possible()


def pack_gptq(u: Unpacked, *, zero_offset: int) -> dict[str, torch.Tensor]:
    """:class:`Unpacked` → the tensors a GPTQ checkpoint stores for one linear layer."""
    n, k = u.codes.shape
    groups = u.scales.shape[1]
    zeros = (
        u.zeros
        if u.zeros is not None
        else torch.full((n, groups), 1 << (u.bits - 1), dtype=torch.uint8)
    )
    stored = (zeros.to(torch.int16) - zero_offset).clamp(min=0)
    g_idx = (u.group_index if u.group_index is not None else torch.arange(k) // (k // groups)).to(
        torch.int32
    )
    return {
        "qweight": _pack_along(u.codes.T, u.bits, 0),
        "qzeros": _pack_along(stored.T, u.bits, 1),
        "scales": u.scales.T.contiguous(),
        "g_idx": g_idx,
    }


# -- AWQ -------------------------------------------------------------------------------------
def _awq_columns(n: int, device: torch.device) -> torch.Tensor:
    """For each packed position ``8j + i``, the output column it holds."""
    order = torch.tensor(AWQ_ORDER, device=device)
    return (torch.arange(0, n, 8, device=device)[:, None] + order[None, :]).reshape(-1)


def unpack_awq(
    qweight: torch.Tensor,
    qzeros: torch.Tensor,
    scales: torch.Tensor,
    shape: tuple[int, int],
    *,
    what: str = "awq",
) -> Unpacked:
    """AWQ (GEMM) tensors of a weight of logical ``shape`` (N, K) → :class:`Unpacked`."""
    groups, n = scales.shape
    if (qweight.shape[0], n) != (shape[1], shape[0]) or qweight.shape[1] * 8 != n:
        raise ValueError(
            f"{what}: qweight of shape {tuple(qweight.shape)} does not hold "
            f"{n} 4-bit output columns per row (AWQ GEMM packs 8 per word)"
        )
    cols = _awq_columns(n, qweight.device)
    packed = _unpack_along(qweight, 4, 1)  # [K, N] in packed order
    codes = torch.empty_like(packed)
    codes[:, cols] = packed
    zp = _unpack_along(qzeros, 4, 1)
    if tuple(zp.shape) != (groups, n):
        raise ValueError(
            f"{what}: qzeros of shape {tuple(qzeros.shape)} does not hold "
            f"{groups} x {n} zero points"
        )
    zeros = torch.empty_like(zp)
    zeros[:, cols] = zp
    return Unpacked(
        codes.T.contiguous(), scales.T.contiguous(), zeros.T.contiguous(), 4
    ).symmetric_if_possible()


def pack_awq(u: Unpacked) -> dict[str, torch.Tensor]:
    """:class:`Unpacked` (4-bit) → AWQ GEMM checkpoint tensors."""
    if u.bits != 4 or u.group_index is not None:
        raise ValueError("AWQ stores 4-bit codes with groups of consecutive columns")
    n = u.codes.shape[0]
    cols = _awq_columns(n, u.codes.device)
    zeros = u.zeros if u.zeros is not None else torch.full_like(u.scales, 8, dtype=torch.uint8)
    return {
        "qweight": _pack_along(u.codes.T[:, cols], 4, 1),
        "qzeros": _pack_along(zeros.T[:, cols], 4, 1),
        "scales": u.scales.T.contiguous(),
    }


# -- compressed-tensors ----------------------------------------------------------------------
def unpack_compressed(
    packed: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    g_idx: torch.Tensor | None,
    shape: tuple[int, int],
    *,
    what: str = "compressed-tensors",
) -> Unpacked:
    """compressed-tensors ``pack-quantized`` tensors of a weight of logical ``shape`` (N, K)
    → :class:`Unpacked`."""
    n, k = shape
    if scale.dim() == 1:
        scale = scale[:, None]
    if packed.shape[0] != n or scale.shape[0] != n:
        raise ValueError(
            f"{what}: weight_packed {tuple(packed.shape)} and weight_scale "
            f"{tuple(scale.shape)} must have {n} rows"
        )
    per_bits = {bits: -(-k * bits // 32) for bits in (4, 8)}
    bits = next((b for b, words in per_bits.items() if words == packed.shape[1]), None)
    if bits is None:
        raise ValueError(
            f"{what}: weight_packed has {packed.shape[1]} words per row; rows of "
            f"{k} codes take {per_bits[4]} (4-bit) or {per_bits[8]} (8-bit)"
        )
    half = 1 << (bits - 1)
    codes = _unpack_along(packed, bits, 1)[:, :k].contiguous()
    zeros = None
    if zero_point is not None:
        zp = zero_point
        if zp.dim() == 1:
            zp = zp[:, None]
        if zp.dtype == torch.int32 and zp.shape[0] != n:
            zp = _unpack_along(zp, bits, 0)[:n]  # packed along the rows, stored unsigned
            zp = zp.to(torch.int16) - half
        if tuple(zp.shape) != tuple(scale.shape):
            raise ValueError(
                f"{what}: weight_zero_point of shape {tuple(zero_point.shape)} "
                f"does not match weight_scale {tuple(scale.shape)}"
            )
        zeros = zp.to(torch.int16) + half
        if int(zeros.min()) < 0 or int(zeros.max()) >= 1 << bits:
            raise ValueError(f"{what}: weight_zero_point outside the {bits}-bit range")
        zeros = zeros.to(torch.uint8)
    if g_idx is not None and tuple(g_idx.shape) != (k,):
        raise ValueError(f"{what}: weight_g_idx has shape {tuple(g_idx.shape)}, expected ({k},)")
    return Unpacked(
        codes, scale.contiguous(), zeros, bits, None if g_idx is None else g_idx.to(torch.int64)
    ).symmetric_if_possible()


# -- Marlin ----------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def marlin_permutations() -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(code permutation of a run of 1024 codes, scale permutation of 64 columns, of 32 for
    per-channel scales), as Marlin defines them: each of the 32 lanes of a warp loads the
    codes of its ``mma.m16n8k16`` fragments of four 16 × 16 tiles, in the word order its
    dequantization takes (even fragment elements in the low nibbles, odd ones in the high)."""
    perm: list[int] = []
    for lane in range(32):
        col = lane // 4
        fragment = [
            16 * row + col + 8 * block
            for block in (0, 1)
            for row in (
                2 * (lane % 4),
                2 * (lane % 4) + 1,
                2 * (lane % 4 + 4),
                2 * (lane % 4 + 4) + 1,
            )
        ]
        for tile in range(4):
            perm.extend(p + 256 * tile for p in fragment)
    interleaved = []
    for start in range(0, len(perm), 8):
        chunk = perm[start : start + 8]
        interleaved.extend(chunk[i] for i in (0, 2, 4, 6, 1, 3, 5, 7))
    scale_perm = [i + 8 * j for i in range(8) for j in range(8)]
    scale_single = [2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25)]
    return tuple(interleaved), tuple(scale_perm), tuple(scale_single)


def _marlin_scale_perm(groups: int) -> torch.Tensor:
    _, grouped, single = marlin_permutations()
    return torch.tensor(single if groups == 1 else grouped)


def unpack_marlin(
    b: torch.Tensor, s: torch.Tensor, shape: tuple[int, int], *, what: str = "marlin"
) -> Unpacked:
    """Marlin tensors (``B``, ``s``) of a weight of logical ``shape`` (N, K) →
    :class:`Unpacked` (4-bit, symmetric)."""
    groups, n = s.shape
    k = b.shape[0] * 16
    if (n, k) != tuple(shape) or b.shape[1] != 2 * n or n % 64 or k % 128:
        raise ValueError(
            f"{what}: B of shape {tuple(b.shape)} and s of shape {tuple(s.shape)} "
            "are not a Marlin weight (B [K/16, 2N], N a multiple of 64, K of 128)"
        )
    perm = torch.tensor(marlin_permutations()[0], device=b.device)
    tiles = _unpack_along(b, 4, 1)  # [K/16, 16 N], each run of 1024 permuted
    tiles = tiles.reshape(-1, 1024)[:, torch.argsort(perm)].reshape(k // 16, 16 * n)
    codes = tiles.reshape(k // 16, n // 16, 16, 16).permute(0, 2, 1, 3).reshape(k, n)
    sp = _marlin_scale_perm(groups).to(s.device)
    scales = s.reshape(-1, sp.numel())[:, torch.argsort(sp)].reshape(groups, n)
    return Unpacked(codes.T.contiguous(), scales.T.contiguous(), None, 4)


def pack_marlin(u: Unpacked) -> dict[str, torch.Tensor]:
    """:class:`Unpacked` (4-bit symmetric, groups of consecutive columns) → ``B`` and ``s``."""
    if u.bits != 4 or u.zeros is not None or u.group_index is not None:
        raise ValueError("Marlin stores 4-bit symmetric codes in groups of consecutive columns")
    n, k = u.codes.shape
    groups = u.scales.shape[1]
    tiles = u.codes.T.reshape(k // 16, 16, n // 16, 16).permute(0, 2, 1, 3).reshape(k // 16, 16 * n)
    perm = torch.tensor(marlin_permutations()[0])
    tiles = tiles.reshape(-1, 1024)[:, perm].reshape(k // 16, 16 * n)
    sp = _marlin_scale_perm(groups)
    scales = u.scales.T.reshape(-1, sp.numel())[:, sp].reshape(groups, n)
    return {"B": _pack_along(tiles, 4, 1), "s": scales.contiguous()}
