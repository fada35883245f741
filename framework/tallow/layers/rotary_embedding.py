"""The rotary embedding modules: :class:`RotaryEmbedding` (a fixed table of cos and sin per
position, rotated on a GPU by one Triton launch for q and k) and
:class:`DynamicNTKRotaryEmbedding` (the base grows with the sequence's length). Which one a
RoPE configuration builds, and with which inverse frequencies, is decided in
:mod:`tallow.layers.rotary`; :mod:`tallow.layers.rope_scaling` derives LongRoPE's from these.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tallow.kernels import rotary_embedding

from .context_length import context_lengths
from .norm import RMSNorm


def apply_rotary(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    head_dim: int,
    rotary_dim: int,
    is_neox_style: bool,
) -> torch.Tensor:
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

    def __init__(
        self,
        head_dim: int,
        rotary_dim: int,
        max_position: int,
        base: float,
        is_neox_style: bool,
        inv_freq: torch.Tensor,
        attention_scaling: float = 1.0,
        cache_len: int | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if rotary_dim > head_dim or rotary_dim % 2:
            raise ValueError(
                f"rotary_dim {rotary_dim} must be even and at most head_dim {head_dim}"
            )
        self.head_dim = head_dim
        self.rotary_dim = rotary_dim
        self.max_position = max_position
        self.base = base
        self.is_neox_style = is_neox_style
        self.attention_scaling = float(attention_scaling)
        self.cache_len = cache_len or max_position
        self.register_buffer(
            "inv_freq", inv_freq.to(device=device, dtype=torch.float32), persistent=False
        )
        self.register_buffer("cos_sin_cache", self._build_cache(self.inv_freq), persistent=False)

    def _build_cache(self, inv_freq: torch.Tensor) -> torch.Tensor:
        t = torch.arange(self.cache_len, dtype=torch.float32, device=inv_freq.device)
        freqs = t[:, None] * inv_freq[None, :]
        return torch.cat(
            (freqs.cos() * self.attention_scaling, freqs.sin() * self.attention_scaling), dim=-1
        )

    def set_freq_factors(self, factors: torch.Tensor) -> None:
        """Divide every frequency by a per-frequency factor and rebuild the cache.

        This is how GGUF files carry Llama 3.1-style scaling (a ``rope_freqs`` tensor).
        """
        factors = factors.reshape(-1).to(device=self.inv_freq.device, dtype=torch.float32)
        if factors.numel() != self.inv_freq.numel():
            raise ValueError(
                f"rope frequency factors: got {factors.numel()} values, expected "
                f"{self.inv_freq.numel()} (rotary_dim / 2)"
            )
        self.inv_freq = self.inv_freq / factors
        self.cos_sin_cache = self._build_cache(self.inv_freq)

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin ``[T, rotary_dim/2]`` of ``positions``, in ``dtype``."""
        cos, sin = self.cos_sin_cache[positions].to(dtype).chunk(2, dim=-1)
        return cos, sin

    def forward(
        self,
        positions: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        qk_norm: tuple[RMSNorm, RMSNorm] | None = None,
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
                positions,
                q,
                k,
                self.cos_sin_cache,
                self.head_dim,
                is_neox=self.is_neox_style,
                inplace=True,
                qk_norm=weights,
                norm_eps=qk_norm[0].eps if qk_norm is not None else 1e-6,
            )
            assert rotated_k is not None  # k was given, so it comes back rotated
            return q, rotated_k
        cos, sin = self.cos_sin(positions, q.dtype)
        q = apply_rotary(q, cos, sin, self.head_dim, self.rotary_dim, self.is_neox_style)
        k = apply_rotary(k, cos, sin, self.head_dim, self.rotary_dim, self.is_neox_style)
        return q, k

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
            f"neox={self.is_neox_style}, cache_len={self.cache_len}"
        )


class DynamicNTKRotaryEmbedding(RotaryEmbedding):
    """NTK-aware dynamic scaling: the base depends on the sequence length.

    A token of a sequence whose context at this step is ``L`` long is rotated with
    ``base * (factor * max(L, max_position) / max_position - (factor - 1)) ** (d / (d - 2))``.
    ``L`` comes from the step's attention metadata (``seq_lens``) when a forward context is
    active, else from the largest position in the call.
    """

    def __init__(
        self, *args: Any, factor: float, **kwargs: Any
    ) -> None:  # Any: RotaryEmbedding's own arguments
        super().__init__(*args, **kwargs)
        self.factor = float(factor)

    def cos_sin(
        self, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        d = self.rotary_dim
        seq_len = torch.clamp(context_lengths(positions), min=self.max_position)
        scale = (self.factor * seq_len / self.max_position) - (self.factor - 1)
        base = self.base * scale ** (d / (d - 2))  # [T] float32
        exponents = (
            torch.arange(0, d, 2, dtype=torch.int64, device=positions.device).to(torch.float32) / d
        )
        inv_freq = 1.0 / (base[:, None] ** exponents[None, :])
        freqs = positions.to(torch.float32)[:, None] * inv_freq
        return freqs.cos().to(dtype), freqs.sin().to(dtype)


def _fusable(qk_norm: tuple[RMSNorm, RMSNorm], head_dim: int) -> bool:
    """Whether the rotary kernel can apply these q/k norms itself: plain (non-offset) RMSNorms
    over one head with one eps."""
    q_norm, k_norm = qk_norm
    return (
        not q_norm.offset
        and not k_norm.offset
        and q_norm.eps == k_norm.eps
        and q_norm.hidden_size == k_norm.hidden_size == head_dim
    )
