"""RMSNorm with an optional fused residual add (the semantics of vLLM's fused_add_rms_norm and
of Hugging Face's Llama/Gemma norms)."""

from __future__ import annotations

import torch

from ._dispatch import triton_enabled


def _check(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor | None) -> None:
    if x.dim() < 1 or weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(
            f"weight: expected [{x.shape[-1] if x.dim() else '?'}] (the last dim "
            f"of x {tuple(x.shape)}), got {tuple(weight.shape)}"
        )
    if not x.is_floating_point():
        raise ValueError(f"x: expected a floating-point tensor, got {x.dtype}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(
            f"residual: expected {tuple(x.shape)} {x.dtype} like x, got "
            f"{tuple(residual.shape)} {residual.dtype}"
        )


def rms_norm_ref(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    gemma_style: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch reference of ``rms_norm`` (same contract)."""
    _check(x, weight, residual)
    if residual is not None:
        x = x + residual  # rounded to x's dtype, as the model's residual stream is
        new_residual = x
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    if gemma_style:
        out = (normed * (1.0 + weight.float())).to(x.dtype)
    else:
        out = (normed.to(x.dtype).float() * weight.float()).to(x.dtype)
    return out if residual is None else (out, new_residual)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    gemma_style: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dim of ``x`` [..., H] with ``weight`` [H].

    Without ``residual``: returns ``out``. With ``residual`` (same shape and dtype as x):
    ``s = x + residual`` (rounded to x's dtype) is normalised and ``(out, s)`` is returned, ``s``
    being the residual stream for the next layer. The mean of squares and the scaling run in
    float32; Llama style rounds the normalised value to x's dtype and multiplies by ``weight``,
    Gemma style (``gemma_style=True``) multiplies by ``1 + weight`` in float32. ``out`` has x's
    dtype and shape. Inputs are not modified. The Triton kernel on CUDA, the reference elsewhere.
    ``weight`` must not be written by any kernel of the step: with PDL the kernel reads it
    before waiting for the previous kernel (see :mod:`tallow.kernels.pdl`).
    """
    _check(x, weight, residual)
    if triton_enabled(x) and x.numel():
        from ._norm_triton import rms_norm_triton

        return rms_norm_triton(x, weight, eps, residual, gemma_style)
    return rms_norm_ref(x, weight, eps, residual, gemma_style)
