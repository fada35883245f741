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
from torch import nn

from tallow.kernels import rotary_embedding

from .context_length import context_lengths
from .norm import RMSNorm

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
        raise ValueError("model config: rope_parameters / rope_scaling must be objects, got "
                         f"{type(params).__name__} / {type(legacy).__name__}")
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
    return 1.0 / (base ** exponents)


def _llama3_inv_freq(inv_freq: torch.Tensor, s: Mapping[str, Any],
                     max_position: int) -> torch.Tensor:
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


def _yarn_inv_freq(base: float, rotary_dim: int, s: Mapping[str, Any],
                   max_position: int) -> tuple[torch.Tensor, float]:
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
    ramp = torch.clamp((torch.arange(rotary_dim // 2, dtype=torch.float32) - low) / (high - low),
                       0, 1)
    pos_freqs = base ** (torch.arange(0, rotary_dim, 2).to(torch.float32) / rotary_dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    keep = 1 - ramp  # 1 where the frequency is extrapolated unchanged
    return interpolation * (1 - keep) + extrapolation * keep, float(attention_factor)


def _require(s: Mapping[str, Any], key: str) -> Any:
    if s.get(key) is None:
        raise ValueError(f"rope_scaling of type {s.get('rope_type')!r} needs {key!r}")
    return s[key]


def compute_inv_freq(rotary_dim: int, max_position: int, base: float,
                     rope_scaling: Mapping[str, Any] | None) -> tuple[torch.Tensor, float]:
    """``(inv_freq [rotary_dim/2] float32, attention_scaling)`` for a RoPE configuration.

    For ``dynamic`` this is the frequency set of sequences no longer than ``max_position``.
    """
    rope_type = _rope_type(rope_scaling)
    if rope_type == "longrope":
        from .rope_scaling import longrope_inv_freq
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
        raise ValueError(f"rope_scaling.rope_type {rope_type!r} is not supported (expected one "
                         f"of {', '.join(SUPPORTED_ROPE_TYPES)})")
    return rope_type


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head_dim: int,
                 rotary_dim: int, is_neox_style: bool) -> torch.Tensor:
    """Rotate the first ``rotary_dim`` features of each head of ``x [T, H*head_dim]``.

    ``cos``/``sin`` are ``[T, rotary_dim/2]`` in ``x``'s dtype. Neox style pairs feature ``i``
    with ``i + rotary_dim/2``; GPT-J style pairs ``2i`` with ``2i+1``.
    """
    n = x.shape[0]
    x = x.view(n, -1, head_dim)
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    if is_neox_style:
        x1, x2 = rot.chunk(2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    if rest.shape[-1]:
        out = torch.cat((out, rest), dim=-1)
    return out.reshape(n, -1)


class RotaryEmbedding(nn.Module):
    """``forward(positions [T], q [T, Hq*D], k [T, Hkv*D]) -> (q, k)`` rotated.

    Holds ``inv_freq`` and a ``[cache_len, rotary_dim]`` float32 cache of ``cos | sin`` (scaled by
    ``attention_scaling``); positions must be below ``cache_len``.
    """

    inv_freq: torch.Tensor
    cos_sin_cache: torch.Tensor

    def __init__(self, head_dim: int, rotary_dim: int, max_position: int, base: float,
                 is_neox_style: bool, inv_freq: torch.Tensor, attention_scaling: float = 1.0,
                 cache_len: int | None = None, device: torch.device | str | None = None) -> None:
        super().__init__()
        if rotary_dim > head_dim or rotary_dim % 2:
            raise ValueError(f"rotary_dim {rotary_dim} must be even and at most head_dim "
                             f"{head_dim}")
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim
        self.max_position = max_position
        self.base = base
        self.is_neox_style = is_neox_style
        self.attention_scaling = float(attention_scaling)
        self.cache_len = cache_len or max_position
        self.register_buffer("inv_freq", inv_freq.to(device=device, dtype=torch.float32),
                             persistent=False)
        self.register_buffer("cos_sin_cache", self._build_cache(self.inv_freq),
                             persistent=False)

    def _build_cache(self, inv_freq: torch.Tensor) -> torch.Tensor:
        t = torch.arange(self.cache_len, dtype=torch.float32, device=inv_freq.device)
        freqs = t[:, None] * inv_freq[None, :]
        return torch.cat((freqs.cos() * self.attention_scaling,
                          freqs.sin() * self.attention_scaling), dim=-1)

    def set_freq_factors(self, factors: torch.Tensor) -> None:
        """Divide every frequency by a per-frequency factor and rebuild the cache.

        This is how GGUF files carry Llama 3.1-style scaling (a ``rope_freqs`` tensor).
        """
        factors = factors.reshape(-1).to(device=self.inv_freq.device, dtype=torch.float32)
        if factors.numel() != self.inv_freq.numel():
            raise ValueError(f"rope frequency factors: got {factors.numel()} values, expected "
                             f"{self.inv_freq.numel()} (rotary_dim / 2)")
        self.inv_freq = self.inv_freq / factors
        self.cos_sin_cache = self._build_cache(self.inv_freq)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[T, rotary_dim/2]`` of ``positions``, in ``dtype``."""
        cos, sin = self.cos_sin_cache[positions].to(dtype).chunk(2, dim=-1)
        return cos, sin

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                qk_norm: tuple[RMSNorm, RMSNorm] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate q [T, Hq*D] and k [T, Hkv*D]. ``qk_norm`` (Qwen3's per-head q and k norms)
        are applied first; on a GPU in the same launch as the rotation."""
        fast = q.is_cuda and type(self).cos_sin is RotaryEmbedding.cos_sin
        if qk_norm is not None and not (fast and _fusable(qk_norm, self.head_dim)):
            n, d = q.shape[0], self.head_dim
            q = qk_norm[0](q.reshape(n, -1, d)).reshape(n, -1)
            k = qk_norm[1](k.reshape(n, -1, d)).reshape(n, -1)
            qk_norm = None
        if fast:
            # one Triton launch rotates q and k in place from the shared cos|sin table
            weights = (qk_norm[0].weight, qk_norm[1].weight) if qk_norm is not None else None
            q, rotated_k = rotary_embedding(
                positions, q, k, self.cos_sin_cache, self.head_dim, is_neox=self.is_neox_style,
                inplace=True, qk_norm=weights,
                norm_eps=qk_norm[0].eps if qk_norm is not None else 1e-6)
            assert rotated_k is not None  # k was given, so it comes back rotated
            return q, rotated_k
        cos, sin = self.cos_sin(positions, q.dtype)
        q = apply_rotary(q, cos, sin, self.head_dim, self.rotary_dim, self.is_neox_style)
        k = apply_rotary(k, cos, sin, self.head_dim, self.rotary_dim, self.is_neox_style)
        return q, k

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
                f"neox={self.is_neox_style}, cache_len={self.cache_len}")


class DynamicNTKRotaryEmbedding(RotaryEmbedding):
    """NTK-aware dynamic scaling: the base depends on the sequence length.

    A token of a sequence whose context at this step is ``L`` long is rotated with
    ``base * (factor * max(L, max_position) / max_position - (factor - 1)) ** (d / (d - 2))``.
    ``L`` comes from the step's attention metadata (``seq_lens``) when a forward context is
    active, else from the largest position in the call.
    """

    def __init__(self, *args: Any, factor: float,
                 **kwargs: Any) -> None:  # Any: RotaryEmbedding's own arguments
        super().__init__(*args, **kwargs)
        self.factor = float(factor)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.rotary_dim
        seq_len = torch.clamp(context_lengths(positions), min=self.max_position)
        scale = (self.factor * seq_len / self.max_position) - (self.factor - 1)
        base = self.base * scale ** (d / (d - 2))  # [T] float32
        exponents = torch.arange(0, d, 2, dtype=torch.int64,
                                 device=positions.device).to(torch.float32) / d
        inv_freq = 1.0 / (base[:, None] ** exponents[None, :])
        freqs = positions.to(torch.float32)[:, None] * inv_freq
        return freqs.cos().to(dtype), freqs.sin().to(dtype)


def get_rope(head_dim: int, rotary_dim: int, max_position: int, base: float,
             rope_scaling: Mapping[str, Any] | None = None, is_neox_style: bool = True, *,
             device: torch.device | str | None = None) -> RotaryEmbedding:
    """Build the rotary embedding of a RoPE configuration (see the module docstring).

    ``max_position`` is the model's ``max_position_embeddings``; ``rope_scaling`` an HF
    ``rope_scaling``/``rope_parameters`` dict (``rope_type`` or ``type`` plus its fields), None
    for plain RoPE. ``linear`` extends the cache to ``max_position * factor``.
    """
    rope_type = _rope_type(rope_scaling)
    if rope_type == "longrope":
        from .rope_scaling import longrope_rotary
        assert rope_scaling is not None
        return longrope_rotary(head_dim, rotary_dim, max_position, base, rope_scaling,
                               is_neox_style, device=device)
    inv_freq, attention_scaling = compute_inv_freq(rotary_dim, max_position, base, rope_scaling)
    cache_len = max_position
    if rope_type == "linear":
        assert rope_scaling is not None
        cache_len = int(max_position * float(_require(rope_scaling, "factor")))
    if rope_type == "dynamic":
        assert rope_scaling is not None
        return DynamicNTKRotaryEmbedding(head_dim, rotary_dim, max_position, base, is_neox_style,
                                         inv_freq, attention_scaling, cache_len, device,
                                         factor=float(rope_scaling["factor"]))
    return RotaryEmbedding(head_dim, rotary_dim, max_position, base, is_neox_style, inv_freq,
                           attention_scaling, cache_len, device)


def _fusable(qk_norm: tuple[RMSNorm, RMSNorm], head_dim: int) -> bool:
    """Whether the rotary kernel can apply these q/k norms itself: plain (non-offset) RMSNorms
    over one head with one eps."""
    q_norm, k_norm = qk_norm
    return (not q_norm.offset and not k_norm.offset and q_norm.eps == k_norm.eps
            and q_norm.hidden_size == k_norm.hidden_size == head_dim)
