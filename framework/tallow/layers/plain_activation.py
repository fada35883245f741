"""Plain (non-gated) activations by their Hugging Face ``hidden_act`` name.

An MLP of the form ``down(act(up(x)))`` (GPT-NeoX, GPT-2, Falcon, Phi-2, BERT ...) gets its
activation from :func:`get_act`, which knows the parameter-free entries of transformers'
``ACT2FN`` under the same names and with the same math. Gated MLPs (``act(gate) * up``) use
:func:`~tallow.layers.get_act_and_mul` instead.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def _relu_squared(x: torch.Tensor) -> torch.Tensor:
    return torch.square(F.relu(x))


def _quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)


def _gelu_clipped(x: torch.Tensor) -> torch.Tensor:
    return torch.clamp(F.gelu(x), -10.0, 10.0)


def _sqrt_softplus(x: torch.Tensor) -> torch.Tensor:
    return F.softplus(x).sqrt()


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x


def _leaky_relu(x: torch.Tensor) -> torch.Tensor:
    return F.leaky_relu(x, 0.01)  # torch.nn.LeakyReLU's default slope, as ACT2FN builds it


# The tanh form of GELU appears under several names in transformers; they differ only in how
# the constant sqrt(2 / pi) is written, so one torch call serves them all.
_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_python": F.gelu,
    "gelu_10": _gelu_clipped,
    "gelu_new": _gelu_tanh,
    "gelu_fast": _gelu_tanh,
    "gelu_accurate": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu_python_tanh": _gelu_tanh,
    "quick_gelu": _quick_gelu,
    "relu": F.relu,
    "relu2": _relu_squared,
    "relu6": F.relu6,
    "leaky_relu": _leaky_relu,
    "silu": F.silu,
    "swish": F.silu,
    "mish": F.mish,
    "hardswish": F.hardswish,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "sqrtsoftplus": _sqrt_softplus,
    "linear": _identity,
}

#: The names :func:`get_act` accepts.
PLAIN_ACTIVATIONS: tuple[str, ...] = tuple(sorted(_ACTIVATIONS))


class Activation(nn.Module):
    """An elementwise activation, ``forward(x) -> act(x)`` of the same shape and dtype."""

    def __init__(self, name: str, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        #: the ``hidden_act`` name it was built from
        self.kind = name
        self._fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._fn(x)

    def extra_repr(self) -> str:
        return self.kind


def get_act(name: str) -> Activation:
    """The plain activation for an HF ``hidden_act`` name; a clear error for unknown ones.

    Activations with learned parameters (``prelu``, ``xielu``) and ``laplace`` are not served:
    none of the decoder architectures tallow loads uses them.
    """
    fn = _ACTIVATIONS.get(name) if isinstance(name, str) else None
    if fn is None:
        raise ValueError(
            f"hidden_act {name!r} is not supported (expected one of {', '.join(PLAIN_ACTIVATIONS)})"
        )
    return Activation(name, fn)
