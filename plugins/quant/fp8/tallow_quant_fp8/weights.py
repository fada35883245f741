"""FP8 weights as the kernels read them, and the conversions into that form.

A weight is float8 e4m3 ``data [rows, cols]`` times a float32 scale, in one of two layouts:

- ``row``: one scale per output row, ``scale [rows]``. Per-channel checkpoints, load-time
  quantization, and per-tensor checkpoints (whose scalar is repeated over the tensor's rows, so
  that the partitions of a merged layer, each with its own scalar, stack into one weight: the
  values are those of the checkpoint, not requantized);
- ``block``: one scale per 128 x 128 block, ``scale [ceil(rows/128), ceil(cols/128)]``
  (DeepSeek-V3 style). Partitions stack along the rows only when each holds whole blocks.

``input_scale`` is the static activation scale of checkpoints that have one (float32 scalar).

Checkpoint tensors may also arrive as :class:`tallow.layers.QuantizedWeight` of scheme ``fp8``
(:func:`as_quantized`): each row's e4m3 bytes followed by its float32 scales (one for
``F8_E4M3_ROW``; for ``F8_E4M3_B128`` the ``ceil(cols/128)`` scales of the row's 128-row block).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from tallow.layers import QuantizedWeight

FP8 = torch.float8_e4m3fn
#: the largest finite e4m3 value
FP8_MAX = 448.0
BLOCK = 128
#: the smallest scale a dynamic quantization divides by (rows of zeros quantize to zeros)
MIN_SCALE = 1e-12
QTYPE_ROW, QTYPE_BLOCK = "F8_E4M3_ROW", "F8_E4M3_B128"


@dataclass(frozen=True)
class Fp8Weight:
    """``data`` (e4m3 ``[rows, cols]``) times ``scale`` (see the module docstring)."""

    data: torch.Tensor
    scale: torch.Tensor
    layout: str  # "row" or "block"
    input_scale: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.data.dtype != FP8 or self.data.dim() != 2:
            raise ValueError(
                f"fp8 weight data must be 2-d {FP8}, got {self.data.dtype} {tuple(self.data.shape)}"
            )
        expected = (
            (self.rows,)
            if self.layout == "row"
            else (-(-self.rows // BLOCK), -(-self.cols // BLOCK))
        )
        if self.layout not in ("row", "block") or tuple(self.scale.shape) != expected:
            raise ValueError(
                f"fp8 weight [{self.rows}, {self.cols}]: a {self.layout!r} scale "
                f"must have shape {expected}, got {tuple(self.scale.shape)}"
            )

    @property
    def rows(self) -> int:
        return self.data.shape[0]

    @property
    def cols(self) -> int:
        return self.data.shape[1]

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, self.cols

    @property
    def block(self) -> bool:
        return self.layout == "block"

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``data * scale`` as ``[rows, cols]`` of ``dtype`` (computed in float32)."""
        return (self.data.float() * self.expanded_scale()).to(dtype)

    def expanded_scale(self) -> torch.Tensor:
        """The scale of every element, broadcastable to ``[rows, cols]``."""
        if not self.block:
            return self.scale[:, None]
        s = self.scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
        return s[: self.rows, : self.cols]

    def rows_of(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (1-d) dequantized, float32 ``[len(ids), cols]`` (token embeddings)."""
        if self.block:
            scale = self.scale[ids // BLOCK].repeat_interleave(BLOCK, 1)[:, : self.cols]
        else:
            scale = self.scale[ids][:, None]
        # gathered as bytes: not every device's indexing kernels take float8
        return self.data.view(torch.uint8)[ids].view(FP8).float() * scale

    def nbytes(self) -> int:
        return self.data.numel() + 4 * self.scale.numel()


def round_to_fp8(values: torch.Tensor) -> torch.Tensor:
    """Float values to e4m3, clamped to +-448 first (the cast alone would give NaN beyond it),
    rounded to nearest even."""
    return values.clamp(-FP8_MAX, FP8_MAX).to(FP8)


def quantize_rows(weight: torch.Tensor) -> Fp8Weight:
    """A float ``[rows, cols]`` weight as e4m3 with one scale per row: ``scale = amax / 448``,
    computed in float32 on the weight's device (``model.isq fp8``)."""
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(
            f"fp8 quantization takes a 2-d float weight, got {weight.dtype} {tuple(weight.shape)}"
        )
    w = weight.float()
    scale = scale_of(w.abs().amax(dim=1))
    return Fp8Weight(round_to_fp8(w / scale[:, None]), scale, "row")


def scale_of(amax: torch.Tensor) -> torch.Tensor:
    """``amax / 448`` correctly rounded, at least ``MIN_SCALE``. The divisor lives on
    ``amax``'s device: torch divides a CUDA tensor by a Python or CPU scalar as a product with
    its reciprocal (one more rounding), where the kernels divide."""
    divisor = torch.full((), FP8_MAX, dtype=torch.float32, device=amax.device)
    return (amax.float() / divisor).clamp(min=MIN_SCALE)


def cat_rows(parts: list[Fp8Weight]) -> Fp8Weight:
    """Partitions stacked along the rows (one weight for a merged layer). Block-scaled ones
    must each hold whole 128-row blocks (the last may end short); static input scales become
    their maximum (the partitions share one input)."""
    if len(parts) == 1:
        return parts[0]
    layouts = {p.layout for p in parts}
    if len(layouts) > 1:
        raise ValueError(f"cannot stack fp8 partitions of layouts {sorted(layouts)}")
    if parts[0].block and any(p.rows % BLOCK for p in parts[:-1]):
        raise ValueError(
            "block-wise fp8 partitions of a merged layer must each hold whole "
            f"{BLOCK}-row blocks; got rows {[p.rows for p in parts]}"
        )
    statics = [p.input_scale for p in parts if p.input_scale is not None]
    if statics and len(statics) != len(parts):
        raise ValueError(
            "some partitions of a merged layer have a static input scale and others do not"
        )
    data = torch.cat([p.data.view(torch.uint8) for p in parts]).view(FP8)  # bytes: see rows_of
    return Fp8Weight(
        data,
        torch.cat([p.scale for p in parts]),
        parts[0].layout,
        torch.stack(statics).amax() if statics else None,
    )


def as_quantized(weight: Fp8Weight) -> QuantizedWeight:
    """``weight`` as a :class:`tallow.layers.QuantizedWeight` of scheme ``fp8`` (each row's
    bytes followed by its float32 scales; see the module docstring)."""
    from tallow.layers import QuantizedWeight

    data = weight.data.view(torch.uint8)
    if weight.block:
        scales = weight.scale.repeat_interleave(BLOCK, 0)[: weight.rows]
        qtype = QTYPE_BLOCK
    else:
        scales, qtype = weight.scale[:, None], QTYPE_ROW
    raw = torch.cat([data, scales.float().contiguous().view(torch.uint8)], dim=1)
    return QuantizedWeight("fp8", qtype, (weight.rows, weight.cols), raw, dequantize_quantized)


def from_quantized(data: torch.Tensor, qtype: str, shape: tuple[int, ...]) -> Fp8Weight:
    """The :class:`Fp8Weight` of a ``QuantizedWeight``'s bytes (rows of e4m3 then scales);
    block scales are read from the first row of each 128-row block."""
    rows, cols = shape
    if qtype not in (QTYPE_ROW, QTYPE_BLOCK):
        raise ValueError(
            f"fp8: unknown quantized type {qtype!r} (expected {QTYPE_ROW} or {QTYPE_BLOCK})"
        )
    groups = 1 if qtype == QTYPE_ROW else -(-cols // BLOCK)
    if tuple(data.shape) != (rows, cols + 4 * groups):
        raise ValueError(
            f"fp8 {qtype} [{rows}, {cols}]: expected {cols + 4 * groups} bytes per "
            f"row, got {tuple(data.shape)}"
        )
    values = data[:, :cols].contiguous().view(FP8)
    scales = data[:, cols:].contiguous().view(torch.float32)
    if qtype == QTYPE_ROW:
        return Fp8Weight(values, scales[:, 0].clone(), "row")
    return Fp8Weight(values, scales[::BLOCK].clone(), "block")


def dequantize_quantized(data: torch.Tensor, qtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    """The dequantizer of fp8 ``QuantizedWeight`` s: float32 of ``shape``."""
    return from_quantized(data, qtype, shape).dequantize()
