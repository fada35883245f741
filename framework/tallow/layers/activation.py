"""Gated activations of MLPs: ``act(gate) * up`` over a merged ``[gate | up]`` input."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tallow.kernels import gelu_tanh_and_mul, silu_and_mul


class SiluAndMul(nn.Module):
    """``x [..., 2d] -> silu(x[..., :d]) * x[..., d:]`` (Llama, Qwen, Mistral)."""

    #: the name :func:`tallow.kernels.linear.gated_linear` knows this activation by
    kind = "silu"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            return silu_and_mul(x)
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]


class GeluTanhAndMul(nn.Module):
    """``x [..., 2d] -> gelu_tanh(x[..., :d]) * x[..., d:]`` (Gemma)."""

    kind = "gelu_tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            return gelu_tanh_and_mul(x)
        d = x.shape[-1] // 2
        return F.gelu(x[..., :d], approximate="tanh") * x[..., d:]


_GATED = {
    "silu": SiluAndMul,
    "swish": SiluAndMul,
    "gelu_pytorch_tanh": GeluTanhAndMul,
    "gelu_tanh": GeluTanhAndMul,
    "gelu_new": GeluTanhAndMul,
}


def get_act_and_mul(name: str) -> nn.Module:
    """The gated activation for an HF ``hidden_act`` name; a clear error for unknown ones."""
    try:
        return _GATED[name]()
    except KeyError:
        raise ValueError(
            f"hidden_act {name!r} is not supported for gated MLPs "
            f"(expected one of {', '.join(sorted(_GATED))})"
        ) from None
