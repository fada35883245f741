"""Qwen3-VL's interleaved M-RoPE: the rotary frequencies take their axis in turn (temporal,
height, width, temporal, ...) instead of in consecutive sections.

Frequency ``j`` (of ``head_dim / 2``) turns with the height position when ``j % 3 == 1`` and
``j < 3 * sections[1]``, with the width position when ``j % 3 == 2`` and
``j < 3 * sections[2]``, else with the temporal position (transformers'
``Qwen3VLTextRotaryEmbedding``). Text tokens have one position on every axis, so without the
step's per-axis positions this is plain RoPE.
"""

from __future__ import annotations

from typing import Sequence

import torch

from tallow.layers import MRotaryEmbedding, current_multimodal_step

__all__ = ["InterleavedMRotaryEmbedding", "interleaved_axes"]


def interleaved_axes(sections: Sequence[int]) -> torch.Tensor:
    """The axis (0 temporal, 1 height, 2 width) of each frequency, ``[sum(sections)]``."""
    if len(sections) != 3:
        raise ValueError(
            f"mrope_section {list(sections)} must have three entries (temporal, height, width)"
        )
    j = torch.arange(sum(sections))
    axes = torch.zeros_like(j)
    axes[(j % 3 == 1) & (j < 3 * sections[1])] = 1
    axes[(j % 3 == 2) & (j < 3 * sections[2])] = 2
    return axes


class InterleavedMRotaryEmbedding(MRotaryEmbedding):
    """:class:`tallow.layers.MRotaryEmbedding` with the axes of the frequencies interleaved."""

    def __init__(
        self,
        head_dim: int,
        sections: Sequence[int],
        max_position: int,
        base: float,
        *,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(head_dim, sections, max_position, base, device=device)
        self.freq_axes = interleaved_axes(self.sections)

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        step = current_multimodal_step()
        axes = step.positions if step is not None and step.positions is not None else None
        if axes is None:
            return super().cos_sin(positions, dtype)
        if axes.shape[0] != 3 or axes.shape[1] != positions.shape[0]:
            raise RuntimeError(
                f"the step has positions {tuple(axes.shape)} for a batch of "
                f"{positions.shape[0]} tokens on 3 axes"
            )
        half = self.rotary_dim // 2
        table = self.cos_sin_cache[axes]  # [3, T, rotary_dim]: cos | sin
        which = self.freq_axes.to(table.device)
        freq = torch.arange(half, device=table.device)
        cos = table[which, :, freq].transpose(0, 1)  # [T, half]
        sin = table[which, :, half + freq].transpose(0, 1)
        return cos.to(dtype), sin.to(dtype)
