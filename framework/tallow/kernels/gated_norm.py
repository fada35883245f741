"""The gated RMSNorm of linear-attention outputs (Qwen3-Next, Qwen3.5): per row of ``x``,
``out = (weight * rmsnorm(x)) * silu(z)``.

The statistics are float32; the normalised row is rounded to ``x``'s dtype and multiplied by
``weight`` in that dtype (one more rounding), then by ``silu(z)`` in float32, and the result
rounded to ``x``'s dtype: transformers' ``Qwen3NextRMSNormGated`` step by step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._dispatch import triton_enabled

__all__ = ["gated_rms_norm", "gated_rms_norm_ref"]


def _check(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor) -> None:
    if z.shape != x.shape:
        raise ValueError(f"z: expected the shape of x {tuple(x.shape)}, got {tuple(z.shape)}")
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(
            f"weight: expected [{x.shape[-1]}] (the last dim of x), got {tuple(weight.shape)}"
        )


def gated_rms_norm_ref(
    x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """Plain-torch reference of :func:`gated_rms_norm` (same contract)."""
    _check(x, z, weight)
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return ((weight.to(dtype) * xf.to(dtype)) * F.silu(z.float())).to(dtype)


def gated_rms_norm(
    x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """``(weight * rmsnorm(x)) * silu(z)`` over the last dimension of ``x`` (see the module
    docstring); ``z`` has ``x``'s shape, ``weight`` its last dimension. One Triton launch on
    CUDA, the reference elsewhere."""
    _check(x, z, weight)
    if triton_enabled(x) and x.numel():
        from ._gated_norm_triton import gated_rms_norm_triton

        return gated_rms_norm_triton(x, z, weight, eps)
    return gated_rms_norm_ref(x, z, weight, eps)
