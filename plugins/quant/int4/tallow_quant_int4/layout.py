"""The one layout every integer checkpoint is repacked into at load: :class:`IntWeight`.

A weight ``[rows, cols]`` (output features by input features) of ``bits``-bit codes
(4 or 8) with one scale, and optionally one zero point, per ``group`` consecutive columns:
``w[n, k] = scale[n, k // group] * (code[n, k] - zero[n, k // group])``. Symmetric weights
have no zero tensor; their zero point is ``2 ** (bits - 1)`` (codes are stored unsigned).

Storage, chosen for the GPU kernels (:mod:`tallow_quant_int4.kernels`):

- ``codes``: int32 ``[rows, cols * bits / 32]``, each row's codes contiguous, in the quads of
  :mod:`tallow.kernels.quads` (16 bytes: 32 four-bit or 16 eight-bit codes; the code of
  column ``4 * s + u`` of a quad in slot ``s`` of word ``u``), which
  :mod:`tallow.kernels.code_bits` decodes.
- ``scales``: ``[rows, cols / group]`` in the checkpoint's float type (float16, bfloat16 or
  float32: kept exact).
- ``zeros``: uint8 ``[rows, cols / group]`` or None (symmetric).
- ``perm``: None, or int64 ``[cols]`` when the checkpoint's groups are not runs of
  consecutive columns (GPTQ's ``desc_act``): column ``j`` of this layout is input feature
  ``perm[j]``, and the matmul reads its input in that order (``x[..., perm]``). Sorting the
  columns by group once at load makes every group a run again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

from tallow.kernels import QUAD_COLUMNS, pack_quads, unpack_quads

#: code widths the layout and kernels support
BITS = (4, 8)
SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_shape(bits: int, group: int, cols: int, what: str) -> None:
    """Refuse a code width, group size or row length the layout cannot hold."""
    if bits not in BITS:
        raise ValueError(f"{what}: {bits}-bit codes are not supported (expected 4 or 8)")
    quad = QUAD_COLUMNS[bits]
    if cols % quad:
        raise ValueError(
            f"{what}: rows of {cols} columns are not a multiple of {quad} "
            f"(the {bits}-bit layout's unit)"
        )
    if group <= 0 or cols % group or group % quad:
        raise ValueError(
            f"{what}: group size {group} must divide the {cols} columns and be a multiple of {quad}"
        )


@dataclass(frozen=True)
class IntWeight:
    """A weight in the plugin's layout (see the module docstring)."""

    bits: int
    group: int
    rows: int
    cols: int
    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None = None
    perm: torch.Tensor | None = None

    def __post_init__(self) -> None:
        what = f"int{self.bits} weight [{self.rows}, {self.cols}]"
        check_shape(self.bits, self.group, self.cols, what)
        expect = {
            "codes": ((self.rows, self.cols * self.bits // 32), (torch.int32,)),
            "scales": ((self.rows, self.cols // self.group), SCALE_DTYPES),
        }
        if self.zeros is not None:
            expect["zeros"] = ((self.rows, self.cols // self.group), (torch.uint8,))
        if self.perm is not None:
            expect["perm"] = ((self.cols,), (torch.int64,))
        for name, (shape, dtypes) in expect.items():
            t = getattr(self, name)
            if tuple(t.shape) != shape or t.dtype not in dtypes:
                raise ValueError(
                    f"{what}: {name} must be {'/'.join(map(str, dtypes))} of shape "
                    f"{shape}, got {t.dtype} {tuple(t.shape)}"
                )

    @property
    def device(self) -> torch.device:
        return self.codes.device

    @property
    def symmetric(self) -> bool:
        return self.zeros is None

    @property
    def zero_point(self) -> int:
        """The zero point of a symmetric weight."""
        return 1 << (self.bits - 1)

    @property
    def type_name(self) -> str:
        """``int4 g128``, ``int8 asym g64``, ``int4 g128 act-order``..."""
        parts = [
            f"int{self.bits}",
            "asym" if self.zeros is not None else "",
            f"g{self.group}" if self.group != self.cols else "per-channel",
            "act-order" if self.perm is not None else "",
        ]
        return " ".join(p for p in parts if p)

    def tensors(self) -> dict[str, torch.Tensor]:
        """The stored tensors by name (``codes``, ``scales``, and ``zeros``/``perm`` when
        present)."""
        out = {"codes": self.codes, "scales": self.scales}
        if self.zeros is not None:
            out["zeros"] = self.zeros
        if self.perm is not None:
            out["perm"] = self.perm
        return out

    def map_rows(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "IntWeight":
        """The weight with ``fn`` applied to the rows of every per-row tensor (codes, scales,
        zeros); ``fn`` may select, reorder or pad rows."""
        codes = fn(self.codes)
        return replace(
            self,
            rows=codes.shape[0],
            codes=codes,
            scales=fn(self.scales),
            zeros=None if self.zeros is None else fn(self.zeros),
        )

    def to(self, device: torch.device) -> "IntWeight":
        return replace(
            self,
            codes=self.codes.to(device),
            scales=self.scales.to(device),
            zeros=None if self.zeros is None else self.zeros.to(device),
            perm=None if self.perm is None else self.perm.to(device),
        )

    def stacks_with(self, other: "IntWeight") -> bool:
        """Whether ``other``'s rows can be appended to this weight's (same columns, codes,
        groups, scale type, zero handling and column order)."""
        same_perm = (self.perm is None and other.perm is None) or (
            self.perm is not None and other.perm is not None and torch.equal(self.perm, other.perm)
        )
        return (self.bits, self.group, self.cols, self.scales.dtype, self.zeros is None) == (
            other.bits,
            other.group,
            other.cols,
            other.scales.dtype,
            other.zeros is None,
        ) and same_perm

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors().values())

    @classmethod
    def cat_rows(cls, weights: list["IntWeight"]) -> "IntWeight":
        """Weights that :meth:`stacks_with` one another, one after the other along the rows."""
        return cat_rows(weights)


def cat_rows(weights: list[IntWeight]) -> IntWeight:
    """Weights that :meth:`IntWeight.stacks_with` one another, one after the other along the
    rows."""
    first = weights[0]
    for w in weights[1:]:
        if not first.stacks_with(w):
            raise ValueError(f"cannot stack a {w.type_name} weight under a {first.type_name} one")
    return replace(
        first,
        rows=sum(w.rows for w in weights),
        codes=torch.cat([w.codes for w in weights]),
        scales=torch.cat([w.scales for w in weights]),
        zeros=None if first.zeros is None else torch.cat([w.zeros for w in weights]),
    )


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Unsigned codes ``[rows, cols]`` → the layout's int32 words (the quads of
    :mod:`tallow.kernels.quads`)."""
    return pack_quads(codes, bits)


def unpack_codes(words: torch.Tensor, bits: int) -> torch.Tensor:
    """The layout's int32 words → unsigned codes ``[rows, cols]`` (uint8)."""
    return unpack_quads(words, bits)


def from_codes(
    codes: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    bits: int,
    *,
    group_index: torch.Tensor | None = None,
    what: str = "weight",
) -> IntWeight:
    """Build an :class:`IntWeight` from unsigned ``codes [rows, cols]``, ``scales [rows,
    groups]`` and ``zeros [rows, groups]`` (None: symmetric). ``group_index [cols]`` gives each
    column's group when groups are not runs of consecutive columns (GPTQ ``g_idx``): the
    columns are then sorted by group, which must give every group the same number of
    columns."""
    rows, cols = codes.shape
    groups = scales.shape[1]
    if cols % groups:
        raise ValueError(f"{what}: {groups} groups do not divide {cols} columns")
    group = cols // groups
    perm = None
    if group_index is not None:
        group_index = group_index.to(codes.device, torch.int64)
        natural = torch.arange(cols, device=codes.device) // group
        if not torch.equal(group_index, natural):
            counts = torch.bincount(group_index, minlength=groups)
            if (
                group_index.min() < 0
                or group_index.max() >= groups
                or bool((counts != group).any())
            ):
                raise ValueError(
                    f"{what}: g_idx must give each of the {groups} groups "
                    f"{group} columns (got counts from {int(counts.min())} to "
                    f"{int(counts.max())})"
                )
            perm = torch.sort(group_index, stable=True).indices
            codes = codes[:, perm]
    check_shape(bits, group, cols, what)
    if zeros is not None:
        zeros = zeros.to(torch.uint8)
    if scales.dtype not in SCALE_DTYPES:
        scales = scales.float()
    return IntWeight(
        bits,
        group,
        rows,
        cols,
        pack_codes(codes, bits).contiguous(),
        scales.contiguous(),
        None if zeros is None else zeros.contiguous(),
        perm,
    )


def dequantize(
    w: IntWeight, dtype: torch.dtype = torch.float32, *, natural_order: bool = True
) -> torch.Tensor:
    """The weight as floats ``[rows, cols]``: ``scale * (code - zero)`` in float32, rounded
    once to ``dtype``. ``natural_order`` (default) puts the columns back in input-feature
    order; False keeps the layout's order (what the matmul multiplies ``x[..., perm]`` by)."""
    codes = unpack_codes(w.codes, w.bits).to(torch.float32)
    idx = torch.arange(w.cols, device=w.device) // w.group
    zero = (
        w.zeros.to(torch.float32)[:, idx]
        if w.zeros is not None
        else torch.tensor(float(w.zero_point), device=w.device)
    )
    out = (w.scales.to(torch.float32)[:, idx] * (codes - zero)).to(dtype)
    if natural_order and w.perm is not None:
        out = out[:, torch.argsort(w.perm)]
    return out
