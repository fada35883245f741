"""Greedy decoding's argmax over each row of the logits (ties: the lowest index)."""

from __future__ import annotations

import torch

from ._dispatch import triton_enabled


def argmax_rows_ref(x: torch.Tensor) -> torch.Tensor:
    """Plain-torch reference of ``argmax_rows``."""
    return x.argmax(dim=-1)


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """Index of the largest entry of each row of ``x [rows, n]`` → int64 [rows] (the first
    one on ties; NaN counts as largest). The two-stage Triton kernel on CUDA, torch
    elsewhere."""
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"argmax_rows: expected x [rows, n] with n > 0, got {tuple(x.shape)}")
    if not triton_enabled(x) or x.shape[0] == 0:
        return argmax_rows_ref(x)
    from ._argmax_triton import argmax_rows_triton

    if x.stride(1) != 1:
        x = x.contiguous()
    return argmax_rows_triton(x)
