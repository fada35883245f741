"""The mixture-of-experts MLP over integer experts: stacked weights, the entry point and its
torch reference.

:class:`StackedInt` is the plugin's layout (:mod:`tallow_quant_int4.layout`) with an expert
dimension in front: ``codes [E, rows, cols * bits / 32]`` (int32 quads), ``scales [E, rows,
groups]``, ``zeros [E, rows, groups]`` (uint8) or None (symmetric). :class:`IntExperts` holds
``w13 [E, 2I, H]`` (each expert's gate rows, then its up rows) and ``w2 [E, H, I]``. Act-order
(a column permutation) is not stacked: every expert would need its own input order.

:func:`fused_moe_int` computes what :func:`tallow.kernels.fused_moe` computes for the decoded
weights (``scale * (code - zero)``), with the same rounding: where Triton runs (CUDA tensors,
``TRITON_INTERPRET=1``) by the kernels of :mod:`tallow_quant_int4.kernels.moe` — a GEMV over
the selected experts for a few tokens, a grouped GEMM that decodes its tiles in the K loop
beyond — elsewhere by :func:`fused_moe_int_ref`: the experts decoded to float32 and
:func:`tallow.kernels.fused_moe_ref`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tallow.kernels import (
    MoEConfig,
    check_moe_routing,
    default_moe_config,
    fused_moe_ref,
    triton_enabled,
)

from .layout import IntWeight, dequantize


@dataclass(frozen=True)
class StackedInt:
    """Integer weights of every expert, stacked (see the module docstring)."""

    bits: int
    group: int
    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        e, rows, words = self.codes.shape
        return e, rows, words * 32 // self.bits

    def flat(self) -> IntWeight:
        """Every expert's rows one after the other, as one :class:`IntWeight` (checks the
        shapes and types)."""
        e, rows, cols = self.shape
        return IntWeight(
            self.bits,
            self.group,
            e * rows,
            cols,
            self.codes.reshape(e * rows, -1),
            self.scales.reshape(e * rows, -1),
            None if self.zeros is None else self.zeros.reshape(e * rows, -1),
        )

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``scale * (code - zero)`` as ``[E, rows, cols]`` of ``dtype``."""
        return dequantize(self.flat(), dtype).reshape(self.shape)

    @classmethod
    def stack(cls, experts: list[IntWeight], what: str) -> "StackedInt":
        """One :class:`IntWeight` per expert (same layout, no act-order) stacked."""
        first = experts[0]
        for e, w in enumerate(experts):
            if w.perm is not None:
                raise ValueError(
                    f"{what}: expert {e} has act-order (g_idx) columns; "
                    "integer experts must keep their columns in order"
                )
            if not first.stacks_with(w) or w.rows != first.rows:
                raise ValueError(
                    f"{what}: expert {e} is {w.type_name} [{w.rows}, {w.cols}], "
                    f"expert 0 {first.type_name} [{first.rows}, {first.cols}]; "
                    "every expert must be stored alike"
                )
        zeros = None if first.zeros is None else torch.stack([w.zeros for w in experts])
        return cls(
            first.bits,
            first.group,
            torch.stack([w.codes for w in experts]),
            torch.stack([w.scales for w in experts]),
            zeros,
        )

    def nbytes(self) -> int:
        tensors = [self.codes, self.scales] + ([self.zeros] if self.zeros is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(frozen=True)
class IntExperts:
    """``w13 [E, 2I, H]`` and ``w2 [E, H, I]`` as :class:`StackedInt`."""

    w13: StackedInt
    w2: StackedInt

    def __post_init__(self) -> None:
        e, two_i, h = self.w13.shape
        if two_i % 2 or self.w2.shape != (e, h, two_i // 2):
            raise ValueError(
                f"integer experts: w13 {self.w13.shape} and w2 {self.w2.shape} do "
                "not fit [E, 2I, H] and [E, H, I]"
            )
        self.w13.flat(), self.w2.flat()  # shapes and types checked

    def dequantize(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        return self.w13.dequantize(dtype), self.w2.dequantize(dtype)

    @property
    def type_name(self) -> str:
        return self.w13.flat().type_name


def _check(
    x: torch.Tensor,
    experts: IntExperts,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
) -> None:
    check_moe_routing("fused_moe_int", x, experts.w13.shape[2], topk_weights, topk_ids, activation)


def fused_moe_int_ref(
    x: torch.Tensor,
    experts: IntExperts,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
    dequantized: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Plain-torch reference of :func:`fused_moe_int`: the core's reference on the decoded
    weights (``dequantized``: ``experts.dequantize()`` when the caller keeps it)."""
    _check(x, experts, topk_weights, topk_ids, activation)
    w13, w2 = dequantized if dequantized is not None else experts.dequantize()
    return fused_moe_ref(
        x,
        w13,
        w2,
        topk_weights,
        topk_ids,
        activation=activation,
        swiglu_alpha=swiglu_alpha,
        swiglu_limit=swiglu_limit,
    )


def fused_moe_int(
    x: torch.Tensor,
    experts: IntExperts,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
    config: MoEConfig | None = None,
    dequantized: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """The expert MLP of ``x [T, H]`` → ``[T, H]`` in x's dtype over integer experts (see the
    module docstring). ``config`` overrides the path and tiles
    (:func:`tallow.kernels.default_moe_config` by token count)."""
    _check(x, experts, topk_weights, topk_ids, activation)
    if x.shape[0] == 0 or not triton_enabled(x):
        return fused_moe_int_ref(
            x,
            experts,
            topk_weights,
            topk_ids,
            activation=activation,
            swiglu_alpha=swiglu_alpha,
            swiglu_limit=swiglu_limit,
            dequantized=dequantized,
        )
    from .kernels.moe import fused_moe_int_triton

    e, two_i, h = experts.w13.shape
    cfg = config or default_moe_config(e, two_i // 2, h, x.shape[0], torch.int32)
    return fused_moe_int_triton(
        x,
        experts.w13,
        experts.w2,
        topk_weights,
        topk_ids,
        activation=activation,
        alpha=swiglu_alpha,
        limit=swiglu_limit,
        config=cfg,
    )
