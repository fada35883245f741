"""LayerNorm with a bias (GPT-NeoX, Pythia, StableLM, Phi-2, ...).

Parameters are named ``weight`` and ``bias``, as in ``torch.nn.LayerNorm``, so Hugging Face
checkpoint names (``...input_layernorm.weight`` / ``.bias``) map onto them one to one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .model import BuildContext


class LayerNorm(nn.Module):
    """``forward(x) -> norm(x)``; ``forward(x, residual) -> (norm(x + residual), x + residual)``.

    ``norm(x) = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias`` over the last dimension,
    computed by ``torch.nn.functional.layer_norm`` (the math of ``torch.nn.LayerNorm``, which
    transformers uses). With ``bias=False`` the layer has no ``bias`` parameter (OLMo-style
    checkpoints that store none). The two-argument form has the same meaning as
    :class:`~tallow.layers.RMSNorm`'s, so a pre-norm decoder layer can swap one for the other.
    """

    def __init__(
        self,
        hidden_size: int,
        eps: float = 1e-5,
        *,
        bias: bool = True,
        build: BuildContext | None = None,
    ) -> None:
        super().__init__()
        build = build if build is not None else BuildContext()
        self.hidden_size = hidden_size
        self.eps = float(eps)
        self.weight = nn.Parameter(
            torch.ones(hidden_size, dtype=build.dtype, device=build.device), requires_grad=False
        )
        if bias:
            self.bias = nn.Parameter(
                torch.zeros(hidden_size, dtype=build.dtype, device=build.device),
                requires_grad=False,
            )
        else:
            self.register_parameter("bias", None)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if residual is None:
            return F.layer_norm(x, (self.hidden_size,), self.weight, self.bias, self.eps)
        x = x + residual
        return F.layer_norm(x, (self.hidden_size,), self.weight, self.bias, self.eps), x

    def extra_repr(self) -> str:
        return f"{self.hidden_size}, eps={self.eps}, bias={self.bias is not None}"
