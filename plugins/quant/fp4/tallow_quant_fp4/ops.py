"""Entry points of the FP4 matmul: the Triton kernels where Triton runs (CUDA tensors, or any
tensor under ``TRITON_INTERPRET=1``), the torch reference elsewhere (which decodes the whole
weight on every call). Up to :data:`MAX_GEMV_ROWS` rows of x take the CUDA-core kernel; more
take the weight decoded into a workspace and cuBLAS. A layer's parts are stacked along the
output rows (:class:`~tallow_quant_fp4.layout.FP4Weight` or dense float tensors)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from tallow.kernels import dense_linear, gated_linear, triton_enabled

from .layout import FP4Weight, dequantize

ACTIVATIONS = ("silu", "gelu_tanh")
MAX_GEMV_ROWS = 16


def activated(x: torch.Tensor, kind: str) -> torch.Tensor:
    """``act(gate) * up`` of a gated MLP's merged input ``x = [gate | up]``."""
    from tallow.kernels import gelu_tanh_and_mul, silu_and_mul

    return silu_and_mul(x) if kind == "silu" else gelu_tanh_and_mul(x)


def linear_ref(x: torch.Tensor, w: FP4Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` in float32 on the decoded weight, in x's dtype."""
    y = F.linear(
        x.to(torch.float32), dequantize(w), None if bias is None else bias.to(torch.float32)
    )
    return y.to(x.dtype)


def linear(
    x: torch.Tensor,
    parts: list[Any],
    bias: torch.Tensor | None = None,
    *,
    gate: str | None = None,
    max_gemv_rows: int = MAX_GEMV_ROWS,
) -> torch.Tensor:
    """``x [..., K] @ W.T (+ bias)`` → ``[..., N]`` in x's dtype, ``W`` the parts stacked
    along the rows; with ``gate`` x is ``[..., 2K]``, ``[gate | up]``."""
    if gate is not None and gate not in ACTIVATIONS:
        raise ValueError(f"gate must be one of {', '.join(ACTIVATIONS)}, got {gate!r}")
    cols = parts[0].cols if isinstance(parts[0], FP4Weight) else parts[0].shape[1]
    width = 2 * cols if gate else cols
    if x.shape[-1] != width:
        raise ValueError(f"fp4 linear: x has {x.shape[-1]} input features, expected {width}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, width)
    if len(parts) == 1 and not isinstance(parts[0], FP4Weight):
        out = (
            dense_linear(x2, parts[0], bias)
            if gate is None
            else gated_linear(x2, parts[0], bias, kind=gate)
        )
        return out.view(*lead, -1)
    fused = triton_enabled(x2) and x2.shape[0] <= max_gemv_rows
    if gate is not None and not fused:
        x2, gate = activated(x2, gate), None
    outs = []
    start = 0
    for p in parts:
        rows = p.rows if isinstance(p, FP4Weight) else p.shape[0]
        b = None if bias is None else bias[start : start + rows]
        start += rows
        if not isinstance(p, FP4Weight):
            outs.append(F.linear(activated(x2, gate) if gate else x2, p.to(x2.dtype), b))
        elif not triton_enabled(x2):
            outs.append(linear_ref(x2, p, b))
        elif fused:
            from .kernels.gemv import gemv_triton

            outs.append(gemv_triton(x2, p, b, gate=gate))
        else:
            from .kernels.dequant import dequantize_triton

            outs.append(F.linear(x2, dequantize_triton(p, x2.dtype), b))
    y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
    return y.view(*lead, -1)


def warm_up(
    parts: list[Any],
    dtype: torch.dtype,
    gate: str | None = None,
    max_gemv_rows: int = MAX_GEMV_ROWS,
) -> None:
    """Compile every kernel variant the parts' matmuls can take, before serving."""
    from .kernels.dequant import dequantize_triton
    from .kernels.gemv import gemv_config, gemv_triton

    for p in parts:
        if not isinstance(p, FP4Weight) or not triton_enabled(p.codes):
            continue
        sample = p.map_rows(lambda t: t[:256]) if p.rows > 256 and p.rows % 256 == 0 else p
        dequantize_triton(sample, dtype)
        m = 1
        while m <= max_gemv_rows:
            x = torch.zeros(m, (2 if gate else 1) * p.cols, dtype=dtype, device=p.device)
            gemv_triton(
                x,
                sample,
                None,
                gate=gate,
                config=gemv_config(m, p.rows, p.cols, p.kind == "nvfp4", p.device),
            )
            m *= 2
