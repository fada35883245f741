"""Entry points of the quantized matmul: the Triton kernels where Triton runs (CUDA tensors,
or any tensor under ``TRITON_INTERPRET=1``), the torch references elsewhere.

A layer's storage is a list of parts stacked along the output rows (the partitions of a merged
layer, joined where they share a layout): :class:`~tallow_quant_int4.layout.IntWeight` or a
dense float tensor. On a GPU a matmul of ``M`` rows takes

- up to :attr:`KernelPolicy.gemv_max_rows` rows: the CUDA-core kernel
  (:mod:`~tallow_quant_int4.kernels.gemv`), which reads each weight once for all rows;
- more rows: the weight decoded into a workspace in x's dtype
  (:mod:`~tallow_quant_int4.kernels.dequant`) and cuBLAS, whose tensor cores then do the
  arithmetic; the decoding reads half a byte and writes two per weight, small against the
  product's cost once there are enough rows.

Nothing here synchronises with the device or allocates differently between two calls of one
shape, so CUDA graphs capture these paths as they are; :func:`warm_up` compiles every variant
a layer can take before serving.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

import torch
import torch.nn.functional as F

from tallow.kernels import dense_linear, gated_linear, triton_enabled

from . import reference
from .layout import IntWeight

Part = Union[IntWeight, torch.Tensor]
ACTIVATIONS = ("silu", "gelu_tanh")
#: the most rows of x the CUDA-core kernel takes
MAX_GEMV_ROWS = 16
#: the default limit: at ~3.3 instructions per weight and row, 16 rows cost the CUDA cores
#: about as much as decoding the weight into a workspace and multiplying on tensor cores
#: (estimated for gate_up on Hopper; ``bench/gpu/int4_micro.py`` measures both)
DEFAULT_GEMV_ROWS = 8


@dataclass(frozen=True)
class KernelPolicy:
    """How a matmul picks its kernel on a GPU (the scheme's settings)."""

    gemv_max_rows: int = DEFAULT_GEMV_ROWS
    #: the layer methods multiply through :mod:`tallow_quant_int4.tensor_core` instead
    tensor_core: bool = False

    def __post_init__(self) -> None:
        rows = self.gemv_max_rows
        if isinstance(rows, bool) or not isinstance(rows, int) or not 0 <= rows <= MAX_GEMV_ROWS:
            raise ValueError(
                f"gemv_max_rows: expected an integer from 0 to {MAX_GEMV_ROWS}, got {rows!r}"
            )


_DEFAULT = KernelPolicy()


def activated(x: torch.Tensor, kind: str) -> torch.Tensor:
    """``act(gate) * up`` of a gated MLP's merged input ``x = [gate | up]``."""
    from tallow.kernels import gelu_tanh_and_mul, silu_and_mul

    return silu_and_mul(x) if kind == "silu" else gelu_tanh_and_mul(x)


def _rows(p: Part) -> int:
    return p.rows if isinstance(p, IntWeight) else p.shape[0]


def _cols(p: Part) -> int:
    return p.cols if isinstance(p, IntWeight) else p.shape[1]


def linear(
    x: torch.Tensor,
    parts: list[Part],
    bias: torch.Tensor | None = None,
    *,
    policy: KernelPolicy | None = None,
    gate: str | None = None,
) -> torch.Tensor:
    """``x [..., K] @ W.T (+ bias)`` → ``[..., N]`` in x's dtype, ``W`` the ``parts`` stacked
    along the rows. With ``gate`` (``"silu"`` or ``"gelu_tanh"``) x is ``[..., 2K]``,
    ``[gate | up]``, and the product is ``(act(gate) * up) @ W.T``."""
    if gate is not None and gate not in ACTIVATIONS:
        raise ValueError(f"gate must be one of {', '.join(ACTIVATIONS)}, got {gate!r}")
    cols = _cols(parts[0])
    width = 2 * cols if gate is not None else cols
    if x.shape[-1] != width:
        raise ValueError(
            f"int linear: x has {x.shape[-1]} input features, expected {width} "
            f"for a weight of {cols} columns" + (" ([gate | up])" if gate is not None else "")
        )
    lead = x.shape[:-1]
    x2 = x.reshape(-1, width)
    n = sum(_rows(p) for p in parts)
    if len(parts) == 1 and not isinstance(parts[0], IntWeight):
        return _dense(x2, parts[0], bias, gate).view(*lead, n)
    policy = policy or _DEFAULT
    fused = triton_enabled(x2) and x2.shape[0] <= policy.gemv_max_rows
    if gate is not None and not (
        fused and all(isinstance(p, IntWeight) and p.perm is None for p in parts)
    ):
        x2, gate = activated(x2, gate), None  # the fused kernel applies it only to x as it is
    if len(parts) == 1:
        return _part(x2, parts[0], bias, gate, fused).view(*lead, n)
    y = torch.empty(x2.shape[0], n, dtype=x2.dtype, device=x2.device)
    start = 0
    for p in parts:
        rows = _rows(p)
        part_bias = None if bias is None else bias[start : start + rows]
        y[:, start : start + rows] = _part(x2, p, part_bias, gate, fused)
        start += rows
    return y.view(*lead, n)


def _dense(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, gate: str | None
) -> torch.Tensor:
    """A dense weight: tallow's dense linear (its GEMV at one row on a GPU)."""
    if gate is None:
        return dense_linear(x, weight, bias)
    return gated_linear(x, weight, bias, kind=gate)


def _part(
    x: torch.Tensor, p: Part, bias: torch.Tensor | None, gate: str | None, fused: bool
) -> torch.Tensor:
    if not isinstance(p, IntWeight):
        return F.linear(x, p.to(x.dtype), bias)
    if not triton_enabled(x):
        return reference.linear_ref(x, p, bias)
    x = reference.permuted_input(x, p)
    if fused:
        from .kernels.gemv import gemv_triton

        return gemv_triton(x, p, bias, gate=gate)
    from .kernels.dequant import dequantize_triton

    return F.linear(x, dequantize_triton(p, x.dtype), bias)


def dequantize(p: Part, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The part decoded, ``[rows, cols]`` of ``dtype``, columns in the layout's order."""
    if not isinstance(p, IntWeight):
        return p.to(dtype)
    if triton_enabled(p.codes):
        from .kernels.dequant import dequantize_triton

        return dequantize_triton(p, dtype)
    from .layout import dequantize as dequantize_ref

    return dequantize_ref(p, dtype, natural_order=False)


def warm_up(
    parts: list[Part],
    dtype: torch.dtype,
    policy: KernelPolicy | None = None,
    gate: str | None = None,
) -> None:
    """Compile, before serving (and before any CUDA-graph capture), every kernel variant the
    parts' matmuls can take: the CUDA-core kernel for each power of two of rows up to the
    policy's limit (configured for the whole weight's shape), and the decoding into a
    workspace. Each runs on a sample of the weight's rows that compiles the same variant (Triton specialises on a row count's divisibility by
    16 and on whether rows are whole blocks). ``gate``: the activation the layer's input
    takes (a gated MLP's down projection)."""
    from .kernels.dequant import dequantize_triton
    from .kernels.gemv import gemv_config, gemv_triton

    policy = policy or _DEFAULT
    for p in parts:
        if not isinstance(p, IntWeight) or not triton_enabled(p.codes):
            continue
        sample = _sample(p)
        dequantize_triton(sample, dtype)
        m = 1
        while m <= policy.gemv_max_rows:
            width = (2 if gate else 1) * p.cols
            x = torch.zeros(m, width, dtype=dtype, device=p.device)
            gemv_triton(
                x,
                sample,
                None,
                gate=gate if p.perm is None else None,
                config=gemv_config(m, p.rows, p.cols, p.bits, p.device),
            )
            m *= 2


def _sample(p: IntWeight, rows: int = 256) -> IntWeight:
    """The first ``rows`` rows of ``p`` when they compile what the whole weight compiles."""
    if p.rows > rows and p.rows % rows == 0:
        return p.map_rows(lambda t: t[:rows])
    return p
