"""Gated activations of MLP blocks: ``act(x[..., :d]) * x[..., d:]`` for x [..., 2d].

The activation is computed in float32 and rounded to x's dtype, then multiplied by the up half
and rounded again: what ``act_fn(gate) * up`` does in the model's dtype in Hugging Face models.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._dispatch import triton_enabled


def _split(name: str, x: torch.Tensor) -> int:
    if x.dim() < 1 or x.shape[-1] % 2:
        raise ValueError(
            f"{name}: expected x [..., 2*d] with an even last dim, got {tuple(x.shape)}"
        )
    if not x.is_floating_point():
        raise ValueError(f"{name}: expected a floating-point tensor, got {x.dtype}")
    return x.shape[-1] // 2


def _gated_ref(x: torch.Tensor, act) -> torch.Tensor:
    d = x.shape[-1] // 2
    gate = act(x[..., :d].float()).to(x.dtype)
    return (gate.float() * x[..., d:].float()).to(x.dtype)


def silu_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """Plain-torch reference of ``silu_and_mul``."""
    _split("x", x)
    return _gated_ref(x, F.silu)


def gelu_tanh_and_mul_ref(x: torch.Tensor) -> torch.Tensor:
    """Plain-torch reference of ``gelu_tanh_and_mul``."""
    _split("x", x)
    return _gated_ref(x, lambda g: F.gelu(g, approximate="tanh"))


def _dispatch(x: torch.Tensor, kind: str) -> torch.Tensor:
    from ._activation_triton import gated_act_triton

    return gated_act_triton(x, kind)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` → [..., d] in x's dtype (SwiGLU: Llama, Qwen,
    Mistral). The Triton kernel on CUDA, the reference elsewhere."""
    _split("x", x)
    if triton_enabled(x) and x.numel():
        return _dispatch(x, "silu")
    return _gated_ref(x, F.silu)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``gelu_tanh(x[..., :d]) * x[..., d:]`` → [..., d] in x's dtype (GeGLU: Gemma). The
    Triton kernel on CUDA, the reference elsewhere."""
    _split("x", x)
    if triton_enabled(x) and x.numel():
        return _dispatch(x, "gelu_tanh")
    return _gated_ref(x, lambda g: F.gelu(g, approximate="tanh"))
