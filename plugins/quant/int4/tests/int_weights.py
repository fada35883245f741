"""Random integer weights for the tests: codes, scales, zero points, act-order group maps."""

from __future__ import annotations

import torch

from tallow_quant_int4.formats import Unpacked


def random_unpacked(
    rows: int,
    cols: int,
    *,
    bits: int = 4,
    group: int = 128,
    zeros: bool = False,
    act_order: bool = False,
    seed: int = 0,
    scale_dtype: torch.dtype = torch.float16,
) -> Unpacked:
    """Uniform random codes with scales in [0.002, 0.02) (a trained layer's magnitudes) and,
    when asked, zero points and a shuffled column-to-group map."""
    gen = torch.Generator().manual_seed(seed)
    group = cols if group == -1 else group
    groups = cols // group
    codes = torch.randint(0, 1 << bits, (rows, cols), generator=gen, dtype=torch.uint8)
    scales = (0.002 + 0.018 * torch.rand(rows, groups, generator=gen)).to(scale_dtype)
    zp = (
        torch.randint(0, 1 << bits, (rows, groups), generator=gen, dtype=torch.uint8)
        if zeros
        else None
    )
    group_index = None
    if act_order:
        group_index = (torch.randperm(cols, generator=gen) // group).to(torch.int64)
    return Unpacked(codes, scales, zp, bits, group_index)


def dense_of(u: Unpacked) -> torch.Tensor:
    """The float32 weight ``scale * (code - zero)`` an :class:`Unpacked` stands for, by the
    definition (each column's own group)."""
    cols = u.codes.shape[1]
    group = cols // u.scales.shape[1]
    index = u.group_index if u.group_index is not None else torch.arange(cols) // group
    zero = (
        u.zeros.float()[:, index]
        if u.zeros is not None
        else torch.full((1, 1), float(1 << (u.bits - 1)))
    )
    return u.scales.float()[:, index] * (u.codes.float() - zero)
