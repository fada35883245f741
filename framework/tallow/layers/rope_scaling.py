"""LongRoPE: the context extension of Phi-3, Phi-3.5 and Phi-4-mini (``rope_type`` ``longrope``,
formerly ``su``).

The checkpoint carries two lists of per-frequency divisors, one value per rotated pair:
``short_factor`` for sequences up to ``original_max_position_embeddings`` tokens and
``long_factor`` beyond. Frequency ``i`` is ``1 / (factor[i] * base ** (2i / rotary_dim))``, and cos
and sin are multiplied by an attention factor: ``attention_factor`` when given, else
``sqrt(1 + ln(s) / ln(original))`` with ``s = factor`` or, without one,
``max_position_embeddings / original`` (1 when ``s <= 1``) — the numbers transformers uses.

Which list rotates a token is decided the way transformers decides it: by the length of the
token's sequence at the step the token is computed (its context so far, from the step's
attention metadata). Keys cached earlier keep the rotation they were stored with, so a
conversation that grows past the original length continues with short-rotated old keys and
long-rotated new tokens, exactly as transformers' generation does; a long prompt prefilled in
chunks rotates each chunk by the length reached at its step.

Both tables live in one ``cos | sin`` cache, the short one (``original`` rows) first and the long
one after it, so a token's row is its position plus an offset computed on the device: the GPU
rotary kernel reads it unchanged and a captured CUDA graph replays it.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import torch

from .context_length import context_lengths
from .norm import RMSNorm
from .rotary_embedding import RotaryEmbedding

LONGROPE_TYPES = ("longrope", "su")


def longrope_attention_factor(
    scaling: Mapping[str, Any], max_position: int, original: int
) -> float:
    """The cos/sin multiplier of a LongRoPE configuration (see the module docstring)."""
    given = scaling.get("attention_factor")
    if given is not None:
        return float(given)
    factor = scaling.get("factor")
    factor = float(factor) if factor is not None else max_position / original
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original))


def _factors(values: Sequence[float] | torch.Tensor | None, pairs: int, key: str) -> torch.Tensor:
    if values is None:  # a GGUF file brings them as tensors, after the model is built
        return torch.ones(pairs, dtype=torch.float32)
    out = torch.as_tensor(values, dtype=torch.float32).reshape(-1)
    if out.numel() != pairs:
        raise ValueError(
            f"rope_scaling.{key}: {out.numel()} values, expected {pairs} "
            "(one per rotated pair: rotary_dim / 2)"
        )
    if not bool(torch.isfinite(out).all()) or bool((out <= 0).any()):
        raise ValueError(f"rope_scaling.{key}: every factor must be a positive number")
    return out


def _base_freq(base: float, rotary_dim: int) -> torch.Tensor:
    """``base ** (2i / rotary_dim)``: frequency ``i`` is ``1 / (factor[i] * this[i])``."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(torch.float32)
    return base ** (exponents / rotary_dim)


class LongRoPERotaryEmbedding(RotaryEmbedding):
    """RoPE with LongRoPE's short and long frequency divisors (see the module docstring).

    ``inv_freq`` holds the short set, ``long_inv_freq`` the long one; ``cos_sin_cache`` has
    ``original + cache_len`` rows.
    """

    def __init__(
        self,
        head_dim: int,
        rotary_dim: int,
        max_position: int,
        base: float,
        is_neox_style: bool,
        *,
        original_max_position: int,
        short_factor: Sequence[float] | torch.Tensor | None,
        long_factor: Sequence[float] | torch.Tensor | None,
        attention_scaling: float = 1.0,
        cache_len: int | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        if original_max_position <= 0:
            raise ValueError(
                "rope_scaling.original_max_position_embeddings must be positive, "
                f"got {original_max_position}"
            )
        pairs = rotary_dim // 2
        base_freq = _base_freq(base, rotary_dim)
        short = _factors(short_factor, pairs, "short_factor")
        long = _factors(long_factor, pairs, "long_factor")
        super().__init__(
            head_dim,
            rotary_dim,
            max_position,
            base,
            is_neox_style,
            1.0 / (short * base_freq),
            attention_scaling,
            cache_len,
            device,
        )
        self.original_max_position = int(original_max_position)
        self._base_freq = base_freq
        self.register_buffer(
            "long_inv_freq", (1.0 / (long * base_freq)).to(self.inv_freq.device), persistent=False
        )
        self._rebuild()

    def _rebuild(self) -> None:
        self.cache_len, full_len = self.original_max_position, self.cache_len
        short = self._build_cache(self.inv_freq)
        self.cache_len = full_len
        self.cos_sin_cache = torch.cat((short, self._build_cache(self.long_inv_freq)))

    def set_factors(
        self,
        short_factor: Sequence[float] | torch.Tensor,
        long_factor: Sequence[float] | torch.Tensor,
    ) -> None:
        """Replace both factor lists (GGUF files store them as tensors) and rebuild the cache."""
        pairs = self.rotary_dim // 2
        device = self.inv_freq.device
        base_freq = self._base_freq.to(device)
        self.inv_freq = 1.0 / (_factors(short_factor, pairs, "short_factor").to(device) * base_freq)
        self.long_inv_freq = 1.0 / (
            _factors(long_factor, pairs, "long_factor").to(device) * base_freq
        )
        self._rebuild()

    def set_freq_factors(self, factors: torch.Tensor) -> None:
        raise ValueError(
            "a LongRoPE embedding takes its factors through set_factors(short, "
            "long), not one rope_freqs tensor"
        )

    def cache_rows(self, positions: torch.Tensor) -> torch.Tensor:
        """The cache row of each token: its position, moved to the long table when its
        sequence is longer than the original context at this step."""
        long = context_lengths(positions) > self.original_max_position
        return positions + long.to(positions.dtype) * self.original_max_position

    def forward(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        qk_norm: tuple[RMSNorm, RMSNorm] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return super().forward(self.cache_rows(positions), q, k, qk_norm)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, original={self.original_max_position}"


def _original(rope_scaling: Mapping[str, Any]) -> int:
    original = rope_scaling.get("original_max_position_embeddings")
    if original is None:
        raise ValueError("rope_scaling of type 'longrope' needs 'original_max_position_embeddings'")
    return int(original)


def longrope_rotary(
    head_dim: int,
    rotary_dim: int,
    max_position: int,
    base: float,
    rope_scaling: Mapping[str, Any],
    is_neox_style: bool = True,
    *,
    device: torch.device | str | None = None,
) -> LongRoPERotaryEmbedding:
    """The LongRoPE embedding of an HF ``rope_scaling`` dict (``short_factor``, ``long_factor``,
    ``original_max_position_embeddings``, optional ``factor`` / ``attention_factor``).

    Factors given as None are ones until :meth:`LongRoPERotaryEmbedding.set_factors` fills
    them.
    """
    original = _original(rope_scaling)
    return LongRoPERotaryEmbedding(
        head_dim,
        rotary_dim,
        max_position,
        base,
        is_neox_style,
        original_max_position=original,
        short_factor=rope_scaling.get("short_factor"),
        long_factor=rope_scaling.get("long_factor"),
        attention_scaling=longrope_attention_factor(rope_scaling, max_position, original),
        cache_len=max(max_position, original),
        device=device,
    )


def longrope_inv_freq(
    rotary_dim: int, max_position: int, base: float, rope_scaling: Mapping[str, Any]
) -> tuple[torch.Tensor, float]:
    """``(inv_freq, attention_scaling)`` of the short set (sequences within the original
    context): what ``compute_inv_freq`` reports for LongRoPE."""
    original = _original(rope_scaling)
    short = _factors(rope_scaling.get("short_factor"), rotary_dim // 2, "short_factor")
    return (
        1.0 / (short * _base_freq(base, rotary_dim)),
        longrope_attention_factor(rope_scaling, max_position, original),
    )
