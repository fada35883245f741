"""Multi-axis rotary embedding (Qwen2-VL's M-RoPE): each token has one position per axis
(temporal, height, width); the rotary frequencies are split into consecutive sections, section
``i`` rotated by the position of axis ``i % axes``.

Text tokens have the same position on every axis, so a step without a
:class:`~tallow.layers.MultimodalStep` (or whose step carries no positions) rotates exactly as
plain RoPE over the engine's 1-D positions.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch

from .multimodal import current_multimodal_step
from .rotary import compute_inv_freq, rope_parameters
from .rotary_embedding import RotaryEmbedding

__all__ = ["MRotaryEmbedding", "mrope_section"]


def mrope_section(config: Mapping[str, Any]) -> list[int]:
    """The ``mrope_section`` of an HF text config (``rope_parameters`` or ``rope_scaling``)."""
    for key in ("rope_parameters", "rope_scaling"):
        params = config.get(key)
        if isinstance(params, Mapping) and params.get("mrope_section"):
            return [int(s) for s in params["mrope_section"]]
    raise ValueError(
        "model config: rope_parameters.mrope_section is required (the frequency "
        "sections of the temporal, height and width axes)"
    )


class MRotaryEmbedding(RotaryEmbedding):
    """``forward(positions [T], q, k)`` as :class:`RotaryEmbedding`, with the positions of the
    current multimodal step's ``positions [axes, T]`` when it has them."""

    def __init__(
        self,
        head_dim: int,
        sections: Sequence[int],
        max_position: int,
        base: float,
        *,
        device: torch.device | str | None = None,
    ) -> None:
        if sum(sections) * 2 != head_dim:
            raise ValueError(
                f"mrope_section {list(sections)} must add up to head_dim / 2 = {head_dim // 2}"
            )
        inv_freq, scaling = compute_inv_freq(head_dim, max_position, base, None)
        super().__init__(
            head_dim, head_dim, max_position, base, True, inv_freq, scaling, max_position, device
        )
        self.sections = [int(s) for s in sections]

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], head_dim: int, *, device: torch.device | str | None = None
    ) -> "MRotaryEmbedding":
        base, scaling, partial = rope_parameters(config)
        if scaling is not None or partial != 1.0:
            raise ValueError(
                "model config: M-RoPE supports plain rotary frequencies only, got "
                f"rope scaling {scaling} and partial_rotary_factor {partial}"
            )
        max_position = int(config.get("max_position_embeddings") or 32768)
        return cls(head_dim, mrope_section(config), max_position, base, device=device)

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        step = current_multimodal_step()
        axes = step.positions if step is not None and step.positions is not None else None
        if axes is None:
            return super().cos_sin(positions, dtype)
        if axes.shape[1] != positions.shape[0]:
            raise RuntimeError(
                f"the step has positions of {axes.shape[1]} tokens for a batch "
                f"of {positions.shape[0]}"
            )
        half = self.rotary_dim // 2
        table = self.cos_sin_cache[axes]  # [axes, T, rotary_dim]: cos | sin
        parts_cos, parts_sin = [], []
        at = 0
        for i, width in enumerate(self.sections):
            rows = table[i % axes.shape[0]]
            parts_cos.append(rows[:, at : at + width])
            parts_sin.append(rows[:, half + at : half + at + width])
            at += width
        return torch.cat(parts_cos, -1).to(dtype), torch.cat(parts_sin, -1).to(dtype)
