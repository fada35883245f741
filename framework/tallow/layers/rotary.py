"""Rotary position embeddings (RoPE) and their context-extension variants.

The inverse frequencies follow the math of transformers' ``ROPE_INIT_FUNCTIONS`` exactly, so a
model built here and its transformers twin rotate q and k identically:

- ``default`` (or no scaling): ``inv_freq[i] = base ** (-2i / rotary_dim)``;
- ``linear``: ``inv_freq / factor`` (position interpolation);
- ``dynamic`` (NTK-aware): when a sequence is longer than ``max_position``, the base grows
  with its length; tokens are rotated with the base of their sequence's length at the step they
  are computed (what transformers does for one sequence);
- ``llama3``: low frequencies divided by ``factor``, high ones kept, a smooth blend between;
- ``yarn``: a ramp between interpolated and extrapolated frequencies, and cos/sin scaled by
  ``attention_factor`` (default ``0.1 ln(factor) + 1``);
- ``longrope`` (``su``): per-frequency short and long divisors chosen by sequence length
  (:mod:`tallow.layers.rope_scaling`).

cos and sin are computed once, in float32, for every position below the cache length and
looked up by position in ``forward``; only ``dynamic`` computes them per step.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch

from .rope_scaling import longrope_inv_freq, longrope_rotary
from .rotary_embedding import DynamicNTKRotaryEmbedding, RotaryEmbedding, apply_rotary

__all__ = [
    "SUPPORTED_ROPE_TYPES",
    "DynamicNTKRotaryEmbedding",
    "RotaryEmbedding",
    "apply_rotary",
    "compute_inv_freq",
    "get_rope",
    "rope_parameters",
]

SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")


def rope_parameters(config: Mapping[str, Any]) -> tuple[float, dict[str, Any] | None, float]:
    """``(base, rope_scaling, partial_rotary_factor)`` from an HF config.

    Reads the current form (``rope_parameters: {rope_type, rope_theta, ...}``), the older one
    (``rope_theta`` plus ``rope_scaling: {type | rope_type, factor, ...}``), and GPT-NeoX's
    keys (``rotary_emb_base`` for the base, ``rotary_pct`` for the rotated fraction of each
    head), in that order of precedence. ``rope_scaling`` is None for plain RoPE.
    """
    params = config.get("rope_parameters") or {}
    legacy = config.get("rope_scaling") or {}
    if not isinstance(params, Mapping) or not isinstance(legacy, Mapping):
        raise ValueError(
            "model config: rope_parameters / rope_scaling must be objects, got "
            f"{type(params).__name__} / {type(legacy).__name__}"
        )
    merged: dict[str, Any] = {**legacy, **params}
    base = merged.pop("rope_theta", None)
    if base is None:
        base = config.get("rope_theta", config.get("rotary_emb_base", 10000.0))
    partial = merged.pop("partial_rotary_factor", None)
    if partial is None:
        partial = config.get("partial_rotary_factor", config.get("rotary_pct", 1.0))
    rope_type = merged.pop("rope_type", None) or merged.pop("type", None) or "default"
    merged.pop("type", None)
    if rope_type == "default":
        return float(base), None, float(partial)
    return float(base), {"rope_type": rope_type, **merged}, float(partial)


def _base_inv_freq(base: float, rotary_dim: int) -> torch.Tensor:
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(torch.float32) / rotary_dim
    return 1.0 / (base**exponents)


def _llama3_inv_freq(
    inv_freq: torch.Tensor, s: Mapping[str, Any], max_position: int
) -> torch.Tensor:
    factor = _require(s, "factor")
    low_freq_factor = _require(s, "low_freq_factor")
    high_freq_factor = _require(s, "high_freq_factor")
    old_context = s.get("original_max_position_embeddings") or max_position
    low_freq_wavelen = old_context / low_freq_factor
    high_freq_wavelen = old_context / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def _yarn_inv_freq(
    base: float, rotary_dim: int, s: Mapping[str, Any], max_position: int
) -> tuple[torch.Tensor, float]:
    original = s.get("original_max_position_embeddings") or max_position
    factor = s.get("factor")
    if factor is None:
        factor = max_position / original
    attention_factor = s.get("attention_factor")
    mscale, mscale_all_dim = s.get("mscale"), s.get("mscale_all_dim")

    def get_mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
        else:
            attention_factor = get_mscale(factor)
    beta_fast = s.get("beta_fast") or 32
    beta_slow = s.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (rotary_dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # keeps the ramp finite
    ramp = torch.clamp(
        (torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1
    )
    pos_freqs = base ** (torch.arange(0, rotary_dim, 2).to(torch.float32) / rotary_dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # 1 where the frequency is extrapolated unchanged
    return interpolation * (1 - keep) + extrapolation * keep, float(attention_factor)


def _require(s: Mapping[str, Any], key: str) -> Any:
    if s.get(key) is None:
        raise ValueError(f"rope_scaling of type {s.get('rope_type')!r} needs {key!r}")
    return s[key]


def compute_inv_freq(
    rotary_dim: int, max_position: int, base: float, rope_scaling: Mapping[str, Any] | None
) -> tuple[torch.Tensor, float]:
    """``(inv_freq [rotary_dim/2] float32, attention_scaling)`` for a RoPE configuration.

    For ``dynamic`` this is the frequency set of sequences no longer than ``max_position``.
    """
    rope_type = _rope_type(rope_scaling)
    if rope_type == "longrope":
        assert rope_scaling is not None
        return longrope_inv_freq(rotary_dim, max_position, base, rope_scaling)
    inv_freq = _base_inv_freq(base, rotary_dim)
    if rope_type in ("default", "dynamic"):
        return inv_freq, 1.0
    assert rope_scaling is not None
    if rope_type == "linear":
        return inv_freq / _require(rope_scaling, "factor"), 1.0
    if rope_type == "llama3":
        return _llama3_inv_freq(inv_freq, rope_scaling, max_position), 1.0
    return _yarn_inv_freq(base, rotary_dim, rope_scaling, max_position)


def _rope_type(rope_scaling: Mapping[str, Any] | None) -> str:
    if not rope_scaling:
        return "default"
    rope_type = rope_scaling.get("rope_type") or rope_scaling.get("type") or "default"
    if rope_type == "su":  # LongRoPE's first name, in Phi-3's early configs
        rope_type = "longrope"
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"rope_scaling.rope_type {rope_type!r} is not supported (expected one "
            f"of {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    return rope_type


def get_rope(
    head_dim: int,
    rotary_dim: int,
    max_position: int,
    base: float,
    rope_scaling: Mapping[str, Any] | None = None,
    is_neox_style: bool = True,
    *,
    device: torch.device | str | None = None,
) -> RotaryEmbedding:
    """Build the rotary embedding of a RoPE configuration (see the module docstring).

    ``max_position`` is the model's ``max_position_embeddings``; ``rope_scaling`` an HF
    ``rope_scaling``/``rope_parameters`` dict (``rope_type`` or ``type`` plus its fields), None
    for plain RoPE. ``linear`` extends the cache to ``max_position * factor``.
    """
    rope_type = _rope_type(rope_scaling)
    if rope_type == "longrope":
        assert rope_scaling is not None
        return longrope_rotary(
            head_dim, rotary_dim, max_position, base, rope_scaling, is_neox_style, device=device
        )
    inv_freq, attention_scaling = compute_inv_freq(rotary_dim, max_position, base, rope_scaling)
    cache_len = max_position
    if rope_type == "linear":
        assert rope_scaling is not None
        cache_len = int(max_position * float(_require(rope_scaling, "factor")))
    if rope_type == "dynamic":
        assert rope_scaling is not None
        return DynamicNTKRotaryEmbedding(
            head_dim,
            rotary_dim,
            max_position,
            base,
            is_neox_style,
            inv_freq,
            attention_scaling,
            cache_len,
            device,
            factor=float(rope_scaling["factor"]),
        )
    return RotaryEmbedding(
        head_dim,
        rotary_dim,
        max_position,
        base,
        is_neox_style,
        inv_freq,
        attention_scaling,
        cache_len,
        device,
    )
