"""Plain-torch references of the plugin's kernels: what a CPU runs, and the oracle of the GPU
kernels. They decode the whole weight on every call (exact and slow)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .layout import IntWeight, dequantize


def permuted_input(x: torch.Tensor, w: IntWeight) -> torch.Tensor:
    """``x [..., cols]`` in the weight's column order (act-order weights read their input
    permuted)."""
    return x if w.perm is None else x.index_select(-1, w.perm)


def linear_ref(x: torch.Tensor, w: IntWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` in float32 on the decoded weight, returned in x's dtype."""
    weight = dequantize(w, torch.float32, natural_order=False)
    y = F.linear(
        permuted_input(x, w).to(torch.float32),
        weight,
        None if bias is None else bias.to(torch.float32),
    )
    return y.to(x.dtype)
