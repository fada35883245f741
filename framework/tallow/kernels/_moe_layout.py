"""What the fused-MoE kernels share with their entry points: the activations and their kernel
codes, and the layout of a routing's rows grouped by expert and padded to the grouped GEMM's
block size (:func:`tallow.kernels.moe.moe_align` makes it). Its own module so that the Triton
kernels and the entry points both import it from below."""

from __future__ import annotations

from dataclasses import dataclass

import torch

ACTIVATIONS = ("silu", "swiglu_clamp", "gelu_tanh")
#: the ``ACT`` constexpr of each activation, as the MoE kernels (the core's and plugins') read it
MOE_ACTIVATION_CODES = {"silu": 0, "swiglu_clamp": 1, "gelu_tanh": 2}


@dataclass(frozen=True)
class MoEAlignment:
    """The grouped GEMM's view of a routing (see :func:`moe_align`).

    ``sorted_ids [capacity]`` int32: flat ``token * top_k + slot`` indices grouped by expert,
    each expert's group padded with ``num_valid`` (an index past every real row) to a multiple
    of ``block_m``; ``expert_ids [capacity / block_m]`` int32: the expert of each block;
    ``rows_used [1]`` int32: how many entries of ``sorted_ids`` the experts' groups fill (blocks
    from there on are skipped)."""

    sorted_ids: torch.Tensor
    expert_ids: torch.Tensor
    rows_used: torch.Tensor
    block_m: int
    num_valid: int


def padded_capacity(num_valid: int, num_experts: int, block_m: int) -> int:
    """Entries of ``sorted_ids`` that any routing of ``num_valid`` rows over ``num_experts``
    experts needs: every row, plus up to ``block_m - 1`` rows of padding for each expert that
    can receive one — rounded up to whole blocks."""
    padded = num_valid + min(num_experts, num_valid) * (block_m - 1)
    return -(-padded // block_m) * block_m
