"""The layout FP4 checkpoints are repacked into at load: :class:`FP4Weight`.

A weight ``[rows, cols]`` of e2m1 codes (a sign bit, two exponent bits, one mantissa bit:
``±{0, 0.5, 1, 1.5, 2, 3, 4, 6}``) with one scale per ``group`` consecutive columns:

- **MXFP4** (OCP Microscaling, gpt-oss): groups of 32, each scale an e8m0 byte ``e``, the
  power of two ``2 ** (e - 127)``;
- **NVFP4**: groups of 16, each scale an e4m3 float8 byte, divided by the weight's float32
  global scale.

``w = value(code) * scale``. The codes are stored as the 4-bit quads of
:mod:`tallow.kernels.quads` (int32 ``[rows, cols / 8]``: in each 16-byte quad of 32 columns,
column ``4 s + u`` in nibble ``s`` of word ``u``), the scales as their bytes (uint8
``[rows, cols / group]``), as the kernels read them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

from tallow.kernels import pack_quads, unpack_quads

#: the e2m1 values by code (bit 3 the sign)
E2M1_VALUES = (
    0.0,
    0.5,
    1.0,
    1.5,
    2.0,
    3.0,
    4.0,
    6.0,
    -0.0,
    -0.5,
    -1.0,
    -1.5,
    -2.0,
    -3.0,
    -4.0,
    -6.0,
)
#: scale encoding and group size of each kind
KINDS = {"mxfp4": 32, "nvfp4": 16}


@dataclass(frozen=True)
class FP4Weight:
    """An FP4 weight in the plugin's layout (see the module docstring)."""

    kind: str
    rows: int
    cols: int
    codes: torch.Tensor
    scales: torch.Tensor
    global_scale: float = 1.0

    def __post_init__(self) -> None:
        what = f"{self.kind} weight [{self.rows}, {self.cols}]"
        if self.kind not in KINDS:
            raise ValueError(f"{what}: kind must be one of {', '.join(KINDS)}")
        if self.cols % 32:
            raise ValueError(f"{what}: rows of {self.cols} columns are not a multiple of 32")
        expect = {
            "codes": ((self.rows, self.cols // 8), torch.int32),
            "scales": ((self.rows, self.cols // self.group), torch.uint8),
        }
        for name, (shape, dtype) in expect.items():
            t = getattr(self, name)
            if tuple(t.shape) != shape or t.dtype != dtype:
                raise ValueError(
                    f"{what}: {name} must be {dtype} of shape {shape}, got "
                    f"{t.dtype} {tuple(t.shape)}"
                )
        if not self.global_scale > 0:
            raise ValueError(f"{what}: the global scale must be positive, got {self.global_scale}")

    @property
    def group(self) -> int:
        return KINDS[self.kind]

    @property
    def device(self) -> torch.device:
        return self.codes.device

    @property
    def type_name(self) -> str:
        return self.kind

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"codes": self.codes, "scales": self.scales}

    def map_rows(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "FP4Weight":
        codes = fn(self.codes)
        return replace(self, rows=codes.shape[0], codes=codes, scales=fn(self.scales))

    def stacks_with(self, other: "FP4Weight") -> bool:
        return (self.kind, self.cols, self.global_scale) == (
            other.kind,
            other.cols,
            other.global_scale,
        )

    @classmethod
    def cat_rows(cls, weights: list["FP4Weight"]) -> "FP4Weight":
        first = weights[0]
        if not all(first.stacks_with(w) for w in weights[1:]):
            raise ValueError("cannot stack FP4 weights of other kinds, widths or global scales")
        return replace(
            first,
            rows=sum(w.rows for w in weights),
            codes=torch.cat([w.codes for w in weights]),
            scales=torch.cat([w.scales for w in weights]),
        )


def from_codes(
    kind: str, codes: torch.Tensor, scales: torch.Tensor, global_scale: float = 1.0
) -> FP4Weight:
    """An :class:`FP4Weight` from e2m1 codes ``[rows, cols]`` (uint8) and scale bytes."""
    rows, cols = codes.shape
    return FP4Weight(
        kind,
        rows,
        cols,
        pack_quads(codes, 4).contiguous(),
        scales.to(torch.uint8).contiguous(),
        float(global_scale),
    )


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """The float32 values of e2m1 codes."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    return table[codes.long()]


def scale_values(kind: str, scales: torch.Tensor, global_scale: float = 1.0) -> torch.Tensor:
    """The float32 scales of scale bytes: ``2 ** (e - 127)`` (MXFP4) or the e4m3 value over
    the global scale (NVFP4)."""
    if kind == "mxfp4":
        return torch.ldexp(
            torch.ones_like(scales, dtype=torch.float32), scales.to(torch.int32) - 127
        )
    # the divisor lives on the scales' device: torch divides a CUDA tensor by a CPU scalar as a
    # product with its reciprocal (one more rounding), and the format divides
    divisor = torch.tensor(global_scale, dtype=torch.float32, device=scales.device)
    return scales.view(torch.float8_e4m3fn).to(torch.float32) / divisor


def dequantize(w: FP4Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The weight as floats ``[rows, cols]``: the code's value times its group's scale in
    float32, rounded once to ``dtype``."""
    values = e2m1_values(unpack_quads(w.codes, 4))
    scales = scale_values(w.kind, w.scales, w.global_scale).repeat_interleave(w.group, dim=1)
    return (values * scales).to(dtype)
