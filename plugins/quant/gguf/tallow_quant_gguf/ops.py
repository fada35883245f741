"""Entry points of the quantized matmul, embedding and dequantization.

Each runs its Triton kernel where Triton runs (CUDA tensors, or any tensor under
``TRITON_INTERPRET=1``) and its torch reference (:mod:`tallow_quant_gguf.reference`)
elsewhere: on a CPU the weights are decoded on every call, exact and slow.
"""

from __future__ import annotations

import torch

from tallow.kernels import triton_enabled

from . import reference
from .packing import PackedWeight
from .scheme import KernelPolicy

_ACTIVATIONS = ("silu", "gelu_tanh")


def _act(x: torch.Tensor, kind: str) -> torch.Tensor:
    from tallow.kernels.activation import gelu_tanh_and_mul, silu_and_mul

    return silu_and_mul(x) if kind == "silu" else gelu_tanh_and_mul(x)


def dequantize(p: PackedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The whole weight decoded, ``[rows, cols]`` in ``dtype``."""
    return reference.dequantize_ref(p).to(dtype)


def embedding(p: PackedWeight, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``ids`` (any shape) decoded, ``[*ids.shape, cols]`` in ``dtype``."""
    if p.qtype is None:
        return torch.nn.functional.embedding(ids, p.planes["dense"]).to(dtype)
    rows = reference.dequantize_rows_ref(p, ids.reshape(-1))
    return rows.to(dtype).view(*ids.shape, p.cols)


def linear(x: torch.Tensor, parts: list[PackedWeight], bias: torch.Tensor | None = None, *,
           policy: KernelPolicy | None = None, gate: str | None = None) -> torch.Tensor:
    """``x [..., K] @ W.T (+ bias)`` → ``[..., N]`` in x's dtype, ``W`` the ``parts`` stacked
    along the rows (the partitions of a merged layer, each of its own type). With ``gate``
    (``"silu"`` or ``"gelu_tanh"``) x is ``[..., 2K]``, ``[gate | up]``, and the product is
    ``(act(gate) * up) @ W.T``."""
    if gate is not None:
        if gate not in _ACTIVATIONS:
            raise ValueError(f"gate must be one of {', '.join(_ACTIVATIONS)}, got {gate!r}")
        x = _act(x, gate)
    cols = parts[0].cols
    if x.shape[-1] != cols:
        raise ValueError(f"quantized linear: x has {x.shape[-1]} input features, the weight "
                         f"expects {cols}")
    return reference.linear_ref(x, parts, bias)


__all__ = ["dequantize", "embedding", "linear", "triton_enabled"]
