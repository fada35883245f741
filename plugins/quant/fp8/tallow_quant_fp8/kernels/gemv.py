"""Weight-only products for decode batches: ``y = x @ (q * s).T (+ b)`` for up to 16 rows of
bf16/fp16 (or float32) activations, the weights read once as e4m3.

The core GEMV (:mod:`tallow.kernels._gemv_triton`) serves float and e4m3 weights alike: one row
streams eight e4m3 rows per program in 16-byte vectors, widened to float32 and scaled per
output row (the row's sum) or per 128 x 128 block (each 128 columns' part of the sum); 2–16
rows use ``tl.dot`` with the weights widened to the activations' dtype. A gated MLP's
activation is applied as the down projection reads its input. This module adapts an
:class:`~tallow_quant_fp8.weights.Fp8Weight` to it.
"""

from __future__ import annotations

import torch

from tallow.kernels import (
    GEMV_MAX_ROWS as MAX_ROWS,
    gemv_config as _core_config,
    gemv_triton as _core_gemv,
)

from ..weights import FP8, Fp8Weight

__all__ = ["MAX_ROWS", "gemv_config", "gemv_triton"]


def gemv_config(m: int, n: int, k: int, blockwise: bool) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps) of the core GEMV for ``m`` rows through an e4m3
    ``[n, k]`` weight (see :func:`tallow.kernels._gemv_triton.gemv_config`)."""
    return _core_config(m, n, k, FP8, blockwise)


def gemv_triton(
    x: torch.Tensor,
    weight: Fp8Weight,
    bias: torch.Tensor | None = None,
    *,
    gate: str | None = None,
    config: tuple[int, int, int, int] | None = None,
) -> torch.Tensor:
    """``x [M, K] @ (q * s).T (+ bias)`` → ``[M, N]`` in x's dtype, M ≤ 16; with ``gate`` x is
    ``[M, 2K]`` (``[gate | up]``). ``config`` overrides :func:`gemv_config` (benchmarks)."""
    return _core_gemv(x, weight.data, bias, scale=weight.scale, gate=gate, config=config)
