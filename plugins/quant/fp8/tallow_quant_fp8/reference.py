"""Plain-torch references of the FP8 kernels: what a CPU (or a GPU without float8 tensor
cores) runs, and the oracles of the Triton kernels.

They compute what the GPU path computes, so that a CPU measurement of quality means something:

- :func:`quantize_activations_ref`: activations to e4m3 with a float32 scale per row (per token)
  or per row and 128-column group, ``scale = amax / 448``, or with a static scale; ``x / scale``
  rounded to nearest even after clamping to +-448. The Triton kernel gives the same bits.
- :func:`linear_ref`: ``x @ W.T`` with ``W`` dequantized; with ``activations`` other than
  ``"none"`` the activations are first quantized and dequantized as above (the W8A8 path of
  larger batches), otherwise multiplied as they are (the weight-only GEMV of decode batches).
  Products are float32 (in the dtype of a dequantized copy kept in 16 bits on a GPU without
  float8); only the order of the additions differs from the GPU's.
"""

from __future__ import annotations

import torch

from .weights import BLOCK, Fp8Weight, round_to_fp8, scale_of


def quantize_activations_ref(
    x: torch.Tensor, group: int | None = None, static_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, K]`` as (e4m3 ``[M, K]``, float32 scales ``[M, G]``): ``G = 1`` per token
    (``group`` None), else one per ``group`` columns (``K`` a multiple of it). A
    ``static_scale`` (float32 scalar) replaces the dynamic ``amax / 448``."""
    m, k = x.shape
    width = k if group is None else group
    if k % width:
        raise ValueError(f"activation groups of {width} do not divide {k} columns")
    x32 = x.float().reshape(m, k // width, width)
    if static_scale is not None:
        scale = static_scale.float().reshape(1, 1).expand(m, k // width)
    else:
        scale = scale_of(x32.abs().amax(dim=-1))
    q = round_to_fp8(x32 / scale[..., None])
    return q.reshape(m, k), scale.contiguous()


def dequantize_activations(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 ``q * scale`` for scales of :func:`quantize_activations_ref`."""
    m, k = q.shape
    groups = scale.shape[1]
    return (q.float().reshape(m, groups, k // groups) * scale[..., None]).reshape(m, k)


def linear_ref(
    x: torch.Tensor,
    weight: Fp8Weight,
    bias: torch.Tensor | None = None,
    *,
    activations: str = "none",
    dequantized: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x [M, K] @ W.T (+ bias)`` in x's dtype, computed in float32 (see the module
    docstring); ``activations``: ``"none"`` (x as it is), ``"token"``, ``"group"`` or
    ``"static"`` (x quantized first). ``dequantized`` is ``weight.dequantize()`` when the
    caller keeps it (converting e4m3 is slow on a CPU)."""
    w = dequantized if dequantized is not None else weight.dequantize()
    if activations == "none":
        x32 = x.float()
    else:
        static = weight.input_scale if activations == "static" else None
        group = BLOCK if activations == "group" else None
        x32 = dequantize_activations(*quantize_activations_ref(x, group, static))
    y = x32.to(w.dtype) @ w.T  # float32, but for a dequantized copy kept in a 16-bit dtype
    if bias is not None:
        y = y + bias.to(y.dtype)
    return y.to(x.dtype)
