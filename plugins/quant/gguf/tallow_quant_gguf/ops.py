"""Entry points of the quantized matmul, embedding and dequantization.

Each runs its Triton kernel where Triton runs (CUDA tensors, or any tensor under
``TRITON_INTERPRET=1``) and its torch reference (:mod:`tallow_quant_gguf.reference`)
elsewhere: on a CPU the weights are decoded on every call, exact and slow.

Which kernel a matmul takes on a GPU depends on its rows ``M`` and the scheme's settings
(:class:`~tallow_quant_gguf.scheme.KernelPolicy`): the fused GEMV up to ``gemv_max_rows``,
the fused tensor-core GEMM below ``dequant_min_rows``, and from there on the weight decoded
into a workspace in x's dtype and multiplied by cuBLAS (``matmul`` forces one of the last two).
Nothing here synchronises with the device or allocates differently between two calls of one
shape, so CUDA graphs capture these paths as they are.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tallow.kernels import triton_enabled

from . import reference
from .packing import PackedWeight
from .scheme import KernelPolicy

_ACTIVATIONS = ("silu", "gelu_tanh")
_DEFAULT_POLICY = KernelPolicy()


def _act(x: torch.Tensor, kind: str) -> torch.Tensor:
    from tallow.kernels.activation import gelu_tanh_and_mul, silu_and_mul

    return silu_and_mul(x) if kind == "silu" else gelu_tanh_and_mul(x)


def dequantize(p: PackedWeight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The whole weight decoded, ``[rows, cols]`` in ``dtype``."""
    if p.qtype is None:
        return p.planes["dense"].to(dtype)
    if triton_enabled(p.planes["d"]):
        from .kernels.dequant import dequantize_triton

        return dequantize_triton(p, dtype)
    return reference.dequantize_ref(p).to(dtype)


def embedding(p: PackedWeight, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``ids`` (any shape) decoded, ``[*ids.shape, cols]`` in ``dtype``."""
    if p.qtype is None:
        return F.embedding(ids, p.planes["dense"]).to(dtype)
    flat = ids.reshape(-1)
    if triton_enabled(flat):
        from .kernels.dequant import dequantize_triton

        rows = dequantize_triton(p, dtype, ids=flat)
    else:
        rows = reference.dequantize_rows_ref(p, flat).to(dtype)
    return rows.view(*ids.shape, p.cols)


def warm_up(parts: list[PackedWeight], dtype: torch.dtype) -> None:
    """Compile, before serving, the dequantization that large batches run into a workspace
    (the engine's warm-up steps are too short to reach it): one row of each quantized part,
    decoded into ``dtype``. Kernels compile once per type and width, so this is cheap after
    the first layer."""
    from .kernels.dequant import dequantize_triton

    for p in parts:
        if p.qtype is not None and triton_enabled(p.planes["d"]):
            row = torch.zeros(1, dtype=torch.long, device=p.device)
            dequantize_triton(p.gather_rows(row), dtype, out=torch.empty(
                1, p.cols, dtype=dtype, device=p.device))


def kernel_for(policy: KernelPolicy, rows: int) -> str:
    """``"gemv"``, ``"gemm"`` (both fused) or ``"dequant"`` (workspace and cuBLAS) for a
    matmul of ``rows`` input rows on a GPU."""
    if policy.matmul == "dequant":
        return "dequant"
    if rows <= policy.gemv_max_rows:
        return "gemv"
    if policy.matmul == "auto" and rows >= policy.dequant_min_rows:
        return "dequant"
    return "gemm"


def linear(x: torch.Tensor, parts: list[PackedWeight], bias: torch.Tensor | None = None, *,
           policy: KernelPolicy | None = None, gate: str | None = None) -> torch.Tensor:
    """``x [..., K] @ W.T (+ bias)`` → ``[..., N]`` in x's dtype, ``W`` the ``parts`` stacked
    along the rows (the partitions of a merged layer, each of its own type). With ``gate``
    (``"silu"`` or ``"gelu_tanh"``) x is ``[..., 2K]``, ``[gate | up]``, and the product is
    ``(act(gate) * up) @ W.T``."""
    if gate is not None and gate not in _ACTIVATIONS:
        raise ValueError(f"gate must be one of {', '.join(_ACTIVATIONS)}, got {gate!r}")
    cols = parts[0].cols
    width = 2 * cols if gate is not None else cols
    if x.shape[-1] != width:
        raise ValueError(f"quantized linear: x has {x.shape[-1]} input features, expected "
                         f"{width} for a weight of {cols} columns"
                         + (" ([gate | up])" if gate is not None else ""))
    lead = x.shape[:-1]
    x2 = x.reshape(-1, width)
    if not triton_enabled(x2):
        if gate is not None:
            x2 = _act(x2, gate)
        return reference.linear_ref(x2, parts, bias).view(*lead, -1)
    policy = policy or _DEFAULT_POLICY
    kind = kernel_for(policy, x2.shape[0])
    n = sum(p.rows for p in parts)
    if kind == "dequant":
        if gate is not None:
            x2 = _act(x2, gate)
        return F.linear(x2, _workspace(parts, n, x2.dtype), bias).view(*lead, n)
    from .kernels.matmul import qmatmul_triton

    y = torch.empty(x2.shape[0], n, dtype=x2.dtype, device=x2.device)
    activated = None
    start = 0
    for p in parts:
        cols_out = y[:, start:start + p.rows]
        part_bias = bias[start:start + p.rows] if bias is not None else None
        if p.qtype is None:  # a dense partition of a merged layer
            if gate is not None and activated is None:
                activated = _act(x2, gate)
            cols_out.copy_(F.linear(activated if gate is not None else x2,
                                    p.planes["dense"].to(x2.dtype), part_bias))
        else:
            qmatmul_triton(x2, p, part_bias, out=cols_out, gate=gate)
        start += p.rows
    return y.view(*lead, n)


def _workspace(parts: list[PackedWeight], n: int, dtype: torch.dtype) -> torch.Tensor:
    """The stacked weight decoded into a fresh ``[n, K]`` tensor of ``dtype``."""
    from .kernels.dequant import dequantize_triton

    ws = torch.empty(n, parts[0].cols, dtype=dtype, device=parts[0].device)
    start = 0
    for p in parts:
        rows = ws[start:start + p.rows]
        if p.qtype is None:
            rows.copy_(p.planes["dense"])
        else:
            dequantize_triton(p, dtype, out=rows)
        start += p.rows
    return ws
