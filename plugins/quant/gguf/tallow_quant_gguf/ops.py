"""Entry points of the quantized matmul, embedding and dequantization.

Each runs its Triton kernel where Triton runs (CUDA tensors, or any tensor under
``TRITON_INTERPRET=1``) and its torch reference (:mod:`tallow_quant_gguf.reference`)
elsewhere: on a CPU the weights are decoded on every call, exact and slow.

Which kernel a matmul takes on a GPU (:mod:`tallow_quant_gguf.tuning`) depends on its weight's
type and shape and on its rows ``M``: the CUDA-core GEMV for one row, the tensor-core kernel,
or the weight decoded into a workspace in x's dtype and multiplied by cuBLAS. Nothing here
synchronises with the device or allocates differently between two calls of one shape, so CUDA
graphs capture these paths as they are; :func:`warm_up` compiles every variant a layer can
take before serving.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from tallow.kernels import triton_enabled

from . import reference
from .packing import PackedWeight
from .scheme import KernelPolicy

_ACTIVATIONS = ("silu", "gelu_tanh")
_DEFAULT_POLICY = KernelPolicy()


def _act(x: torch.Tensor, kind: str) -> torch.Tensor:
    from tallow.kernels import gelu_tanh_and_mul, silu_and_mul

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


def warm_up(
    parts: list[PackedWeight],
    dtype: torch.dtype,
    policy: KernelPolicy | None = None,
    gated: str | None = None,
) -> None:
    """Compile, before serving (and before any CUDA-graph capture), every kernel variant the
    parts' matmuls can take at any number of rows — one per row bucket of
    :mod:`~tallow_quant_gguf.tuning` — plus the row dequantization of the workspace path and
    the embedding; and make the per-device buffers (split-K counters, the IQ4 table). Each
    variant runs once on a few rows of the weight: the kernels compile once per type, shape
    class and configuration, so this is quick after the first layer. ``gated`` is the
    activation the layer's input takes (a gated MLP's down projection)."""
    from .kernels.dequant import dequantize_triton
    from .kernels.splitk import counters
    from .tuning import BUCKETS

    policy = policy or _DEFAULT_POLICY
    for p in parts:
        if p.qtype is None or not triton_enabled(p.planes["d"]):
            continue
        counters(p.device)
        row = torch.zeros(1, dtype=torch.long, device=p.device)
        dequantize_triton(
            p.gather_rows(row), dtype, out=torch.empty(1, p.cols, dtype=dtype, device=p.device)
        )
        dequantize_triton(p, dtype, ids=row)
        seen = set()
        for m in BUCKETS:
            choice = policy.choice(p.type_name, p.rows, p.cols, m, p.device)
            if choice.path == "dequant" or choice in seen:
                continue
            seen.add(choice)
            sample = _warm_sample(p, choice)
            x = torch.zeros(
                1 if choice.path == "gemv" else min(m, 16),
                (2 if gated else 1) * p.cols,
                dtype=dtype,
                device=p.device,
            )
            _fused(x, sample, None, choice, gated)


def _warm_sample(p: PackedWeight, choice: Any) -> PackedWeight:
    """A few rows of ``p`` that compile the same kernel variant as the whole weight: the
    kernels specialise on whether the row count is a multiple of the row block."""
    block = choice.config[0] if choice.path == "gemv" else choice.config[1]
    n = block * 2 if p.rows % block == 0 and p.rows >= 2 * block else p.rows
    return p.map(lambda t: t[:n]) if n < p.rows else p


def _fused(
    x: torch.Tensor,
    p: PackedWeight,
    bias: torch.Tensor | None,
    choice: Any,
    gate: str | None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    if choice.path == "gemv":
        from .kernels.gemv import gemv_triton

        return gemv_triton(x, p, bias, out=out, gate=gate, config=choice.config)
    from .kernels.matmul import qmatmul_triton

    return qmatmul_triton(x, p, bias, out=out, gate=gate, config=choice.config)


def linear(
    x: torch.Tensor,
    parts: list[PackedWeight],
    bias: torch.Tensor | None = None,
    *,
    policy: KernelPolicy | None = None,
    gate: str | None = None,
) -> torch.Tensor:
    """``x [..., K] @ W.T (+ bias)`` → ``[..., N]`` in x's dtype, ``W`` the ``parts`` stacked
    along the rows (the partitions of a merged layer, each of its own type). With ``gate``
    (``"silu"`` or ``"gelu_tanh"``) x is ``[..., 2K]``, ``[gate | up]``, and the product is
    ``(act(gate) * up) @ W.T``."""
    if gate is not None and gate not in _ACTIVATIONS:
        raise ValueError(f"gate must be one of {', '.join(_ACTIVATIONS)}, got {gate!r}")
    cols = parts[0].cols
    width = 2 * cols if gate is not None else cols
    if x.shape[-1] != width:
        raise ValueError(
            f"quantized linear: x has {x.shape[-1]} input features, expected "
            f"{width} for a weight of {cols} columns"
            + (" ([gate | up])" if gate is not None else "")
        )
    lead = x.shape[:-1]
    x2 = x.reshape(-1, width)
    if not triton_enabled(x2):
        if gate is not None:
            x2 = _act(x2, gate)
        return reference.linear_ref(x2, parts, bias).view(*lead, -1)
    policy = policy or _DEFAULT_POLICY
    m = x2.shape[0]
    n = sum(p.rows for p in parts)
    quantized = [p for p in parts if p.qtype is not None]
    if not quantized:
        return F.linear(_act(x2, gate) if gate else x2, _workspace(parts, n, x2.dtype), bias).view(
            *lead, n
        )
    # the layer's largest quantized part decides between the workspace and the fused kernels
    main = max(quantized, key=lambda p: p.rows)
    if policy.choice(main.type_name, n, main.cols, m, x2.device).path == "dequant":
        if gate is not None:
            x2 = _act(x2, gate)
        return F.linear(x2, _workspace(parts, n, x2.dtype), bias).view(*lead, n)
    y = torch.empty(m, n, dtype=x2.dtype, device=x2.device)
    activated = None
    start = 0
    for p in parts:
        cols_out = y[:, start : start + p.rows]
        part_bias = bias[start : start + p.rows] if bias is not None else None
        if p.qtype is None:  # a dense partition of a merged layer
            if gate is not None and activated is None:
                activated = _act(x2, gate)
            cols_out.copy_(
                F.linear(
                    activated if gate is not None else x2, p.planes["dense"].to(x2.dtype), part_bias
                )
            )
        else:
            choice = policy.choice(p.type_name, p.rows, p.cols, m, x2.device)
            if choice.path == "dequant":  # a part whose own table entry prefers cuBLAS
                choice = policy.choice(p.type_name, p.rows, p.cols, m, x2.device, fused=True)
            _fused(x2, p, part_bias, choice, gate, out=cols_out)
        start += p.rows
    return y.view(*lead, n)


def _workspace(parts: list[PackedWeight], n: int, dtype: torch.dtype) -> torch.Tensor:
    """The stacked weight decoded into a fresh ``[n, K]`` tensor of ``dtype``."""
    from .kernels.dequant import dequantize_triton

    ws = torch.empty(n, parts[0].cols, dtype=dtype, device=parts[0].device)
    start = 0
    for p in parts:
        rows = ws[start : start + p.rows]
        if p.qtype is None:
            rows.copy_(p.planes["dense"])
        else:
            dequantize_triton(p, dtype, out=rows)
        start += p.rows
    return ws
