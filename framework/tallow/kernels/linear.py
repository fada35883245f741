"""Dense linear layers: ``y = x @ W.T + b``.

A decode step with few sequences multiplies a handful of rows by every weight matrix; there the
Triton GEMV of :mod:`tallow.kernels._gemv_triton` streams the weights. Larger batches are matrix
products, which cuBLAS (``F.linear``) does best.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._dispatch import triton_enabled
from .activation import gelu_tanh_and_mul, silu_and_mul

#: The most rows that take the Triton GEMV; more go to cuBLAS. The GEMV's several-row
#: (tl.dot) path was slower than cuBLAS on most llama-3-8b shapes at 2–16 rows
#: (faster only on gate_up); it has not been tuned inside CUDA graphs yet.
GEMV_MAX_ROWS = 1
_GEMV_DTYPES = (torch.bfloat16, torch.float16)


def linear_ref(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """Plain-torch reference of ``linear``."""
    return F.linear(x, weight, bias)


def _gemv_fits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    return (
        0 < rows <= GEMV_MAX_ROWS
        and x.dtype in _GEMV_DTYPES
        and weight.dtype == x.dtype
        and weight.dim() == 2
        and weight.stride(1) == 1
        and (bias is None or (bias.dtype == x.dtype and bias.is_contiguous()))
        and triton_enabled(x)
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x [..., K] @ weight [N, K].T (+ bias [N])`` → [..., N]: the Triton GEMV for a few rows
    of bf16/fp16 on CUDA, ``F.linear`` otherwise.

    ``weight`` must not be written by any kernel of the step (a parameter, not a tensor
    computed on the fly): with PDL the GEMV reads it before waiting for the previous kernel
    (see :mod:`tallow.kernels.pdl`)."""
    if x.shape[-1] != weight.shape[-1]:
        raise ValueError(
            f"linear: x has {x.shape[-1]} input features, weight expects "
            f"{weight.shape[-1]} (weight shape {tuple(weight.shape)})"
        )
    if not _gemv_fits(x, weight, bias):
        return F.linear(x, weight, bias)
    from ._gemv_triton import gemv_triton

    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return gemv_triton(x2, weight, bias).view(*x.shape[:-1], weight.shape[0])


def gated_gemv_fits(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> bool:
    """Whether :func:`gated_linear` of a merged ``[gate | up]`` input ``x`` runs as one GEMV
    (one row of bf16/fp16 on a GPU, contiguous)."""
    rows = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    return (
        rows == 1
        and x.shape[-1] == 2 * weight.shape[-1]
        and x.stride(-1) == 1
        and _gemv_fits(x[..., : weight.shape[-1]], weight, bias)
    )


def gated_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, kind: str
) -> torch.Tensor:
    """``(act(x[..., :d]) * x[..., d:]) @ weight [N, d].T (+ bias)`` → [..., N], act "silu"
    or "gelu_tanh": a gated MLP's activation and down projection. One row on a GPU is one
    GEMV that applies the activation as it reads x (same bits as the two steps); otherwise the
    activation kernel then :func:`linear`."""
    acts = {"silu": silu_and_mul, "gelu_tanh": gelu_tanh_and_mul}
    if kind not in acts:
        raise ValueError(f"gated_linear: kind must be one of {', '.join(acts)}, got {kind!r}")
    d = weight.shape[-1]
    if x.shape[-1] != 2 * d:
        raise ValueError(
            f"gated_linear: x must have 2 x {d} = {2 * d} features ([gate | up] "
            f"for a weight of shape {tuple(weight.shape)}), got {x.shape[-1]}"
        )
    if not gated_gemv_fits(x, weight, bias):
        return linear(acts[kind](x), weight, bias)
    return gated_gemv(x, weight, bias, kind=kind)


def gated_gemv(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, kind: str
) -> torch.Tensor:
    """The one-GEMV path of :func:`gated_linear`, for a caller that has checked
    :func:`gated_gemv_fits` and ``kind`` ("silu" or "gelu_tanh") itself."""
    from ._gemv_triton import gemv_triton

    return gemv_triton(x.reshape(1, x.shape[-1]), weight, bias, gate=kind).view(
        *x.shape[:-1], weight.shape[0]
    )
