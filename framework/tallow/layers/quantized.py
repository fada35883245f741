"""Checkpoint tensors that arrive still quantized.

A weight format whose files store block-quantized tensors (GGUF's Q4_K, say) yields them as
:class:`QuantizedWeight`: the raw bytes, the format's type name, the logical shape, and a
function that turns them into float32. Which component consumes them is decided when the
model loads:

- a parameter whose ``weight_loader`` understands them (it carries ``accepts_quantized =
  True``, set by a quantization scheme's :class:`~tallow.layers.LinearMethod`) receives the
  :class:`QuantizedWeight` itself and keeps the blocks;
- every other parameter receives ``dequantize()``'s float32 tensor, so a model loads whether
  or not a scheme for the format is installed.

The format never needs to know which schemes exist, and a scheme never imports a format.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import torch

#: ``dequantizer(data, qtype, shape) -> float32 tensor of shape``
Dequantizer = Callable[[torch.Tensor, str, "tuple[int, ...]"], torch.Tensor]


@dataclass(frozen=True)
class QuantizedWeight:
    """One quantized checkpoint tensor (see the module docstring).

    ``data`` holds one row of bytes per logical row: ``[*shape[:-1], bytes per row]``, uint8,
    so whole rows can be selected, permuted or sliced without decoding. ``scheme`` names the
    family of the encoding (``"gguf"``: GGML block types) and ``qtype`` the type within it
    (``"Q4_K"``).
    """

    scheme: str
    qtype: str
    shape: tuple[int, ...]
    data: torch.Tensor
    dequantizer: Dequantizer

    def __post_init__(self) -> None:
        if self.data.dtype != torch.uint8 or tuple(self.data.shape[:-1]) != tuple(self.shape[:-1]):
            raise ValueError(
                f"{self.scheme} {self.qtype}: data must be uint8 with one row of "
                f"bytes per logical row {tuple(self.shape)}, got "
                f"{self.data.dtype} {tuple(self.data.shape)}"
            )

    def dequantize(self) -> torch.Tensor:
        """The tensor as float32, of shape :attr:`shape`."""
        out = self.dequantizer(self.data, self.qtype, self.shape)
        if tuple(out.shape) != tuple(self.shape):
            raise ValueError(
                f"{self.scheme} {self.qtype}: dequantized to shape "
                f"{tuple(out.shape)}, expected {tuple(self.shape)}"
            )
        return out

    def map_rows(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "QuantizedWeight":
        """The weight with ``fn`` applied to its rows of bytes; ``fn`` must keep the shape (a
        permutation of rows, as undoing GGUF's Q/K interleaving is)."""
        data = fn(self.data)
        if tuple(data.shape) != tuple(self.data.shape):
            raise ValueError(
                f"{self.scheme} {self.qtype}: a row transform changed the shape "
                f"of the blocks from {tuple(self.data.shape)} to "
                f"{tuple(data.shape)}"
            )
        return replace(self, data=data)

    def select(self, index: int) -> "QuantizedWeight":
        """The sub-tensor at ``index`` of the leading dimension (one expert of a stacked
        ``[E, N, K]`` weight), still quantized: its rows of bytes are a view."""
        if len(self.shape) < 2 or not 0 <= index < self.shape[0]:
            raise ValueError(
                f"{self.scheme} {self.qtype}: cannot select index {index} of a "
                f"tensor of shape {tuple(self.shape)}"
            )
        return replace(self, shape=tuple(self.shape[1:]), data=self.data[index])

    @property
    def nbytes(self) -> int:
        return self.data.numel()
