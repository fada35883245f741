"""RMSNorm, with the residual add fused in (one call site for a fused kernel later)."""

from __future__ import annotations

import torch
from torch import nn

from tallow.kernels import rms_norm

from .model import BuildContext


def rms_norm_ref(
    x: torch.Tensor, weight: torch.Tensor, eps: float, offset: bool = False
) -> torch.Tensor:
    """Plain-torch RMSNorm over the last dimension, the math transformers uses.

    The statistics are taken in float32. With ``offset=False`` (Llama, Qwen, Mistral) the
    normalised value is cast back to ``x``'s dtype before the multiply by ``weight``; with
    ``offset=True`` (Gemma) the scale is ``1 + weight`` and the multiply happens in float32.
    """
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if offset:
        return (xf * (1.0 + weight.float())).to(dtype)
    return weight * xf.to(dtype)


class RMSNorm(nn.Module):
    """``forward(x) -> norm(x)``; ``forward(x, residual) -> (norm(x + residual), x + residual)``.

    The second form is the pre-norm residual stream of a decoder layer: the sum becomes the next
    residual. ``offset=True`` selects the Gemma form, whose checkpoint stores ``weight`` such that
    the scale is ``1 + weight`` (initialised to zero rather than one).
    """

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-6,
        *,
        offset: bool = False,
        build: BuildContext | None = None,
    ) -> None:
        super().__init__()
        build = build if build is not None else BuildContext()
        self.hidden_size = hidden_size
        self.eps = float(eps)
        self.offset = offset
        init = torch.zeros if offset else torch.ones
        self.weight = nn.Parameter(
            init(hidden_size, dtype=build.dtype, device=build.device), requires_grad=False
        )

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if x.is_cuda:  # one fused Triton kernel: add, statistics, scale
            return rms_norm(x, self.weight, self.eps, residual=residual, gemma_style=self.offset)
        if residual is None:
            return rms_norm_ref(x, self.weight, self.eps, self.offset)
        x = x + residual
        return rms_norm_ref(x, self.weight, self.eps, self.offset), x

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}, offset={self.offset}"
