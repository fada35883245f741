"""The mixture-of-experts MLP over e4m3 experts: stacked weights, the entry point and its torch
reference.

:class:`Fp8Experts` holds ``w13 [E, 2I, H]`` (each expert's gate rows, then its up rows) and
``w2 [E, H, I]`` as float8 e4m3 with float32 scales, per output row (``[E, rows]``) or per
128 x 128 block (``[E, ceil(rows/128), ceil(cols/128)]``). The experts are weight-only: the
activations are multiplied as they are (bf16, fp16 or float32) by the dequantized weights.

:func:`fused_moe_fp8` computes what :func:`tallow.kernels.fused_moe` computes for the
dequantized weights (``q * scale``), with the same rounding (float32 products, the
intermediate stored in x's dtype, the top-k sum in float32): on a CUDA GPU of compute
capability 8.9+ (and under ``TRITON_INTERPRET=1``) by the Triton kernels of
:mod:`tallow_quant_fp8.kernels.moe` — a GEMV over the selected experts for a few tokens, a
grouped GEMM with the e4m3 tile widened in the K loop beyond — elsewhere by
:func:`fused_moe_fp8_ref`: the weights dequantized to float32 (once; the caller may keep
them) and :func:`tallow.kernels.fused_moe_ref`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tallow.kernels import MoEConfig, check_moe_routing, default_moe_config, fused_moe_ref

from .ops import kernels_run
from .weights import BLOCK, FP8


@dataclass(frozen=True)
class Fp8Experts:
    """Stacked e4m3 experts and their scales (see the module docstring); ``layout`` is
    ``"row"`` or ``"block"``."""

    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    layout: str

    def __post_init__(self) -> None:
        if self.layout not in ("row", "block"):
            raise ValueError(f"fp8 experts: layout must be 'row' or 'block', got {self.layout!r}")
        for name in ("w13", "w2"):
            w, s = getattr(self, name), getattr(self, f"{name}_scale")
            if w.dtype != FP8 or w.dim() != 3:
                raise ValueError(
                    f"fp8 experts: {name} must be 3-d {FP8}, got {w.dtype} {tuple(w.shape)}"
                )
            e, rows, cols = w.shape
            expected = (
                (e, rows) if self.layout == "row" else (e, -(-rows // BLOCK), -(-cols // BLOCK))
            )
            if tuple(s.shape) != expected or s.dtype != torch.float32:
                raise ValueError(
                    f"fp8 experts: {name}_scale of a {self.layout}-scaled "
                    f"{tuple(w.shape)} weight must be float32 {expected}, got "
                    f"{s.dtype} {tuple(s.shape)}"
                )
        e, two_i, h = self.w13.shape
        if two_i % 2 or tuple(self.w2.shape) != (e, h, two_i // 2):
            raise ValueError(
                f"fp8 experts: w13 {tuple(self.w13.shape)} and w2 "
                f"{tuple(self.w2.shape)} do not fit [E, 2I, H] and [E, H, I]"
            )
        if self.block and (two_i // 2) % BLOCK:
            raise ValueError(
                f"fp8 experts: block-scaled experts need an intermediate size "
                f"(per rank) that is a multiple of {BLOCK}, got {two_i // 2}"
            )

    @property
    def block(self) -> bool:
        return self.layout == "block"

    def dequantize(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """(``w13``, ``w2``) as ``q * scale`` in ``dtype`` (computed in float32)."""
        return (
            dequantize_stacked(self.w13, self.w13_scale, self.block).to(dtype),
            dequantize_stacked(self.w2, self.w2_scale, self.block).to(dtype),
        )

    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size() for t in (self.w13, self.w13_scale, self.w2, self.w2_scale)
        )


def dequantize_stacked(data: torch.Tensor, scale: torch.Tensor, block: bool) -> torch.Tensor:
    """float32 ``data [E, rows, cols] * scale`` (per row, or per 128 x 128 block)."""
    if not block:
        return data.float() * scale[..., None]
    rows, cols = data.shape[1:]
    s = scale.repeat_interleave(BLOCK, 1).repeat_interleave(BLOCK, 2)[:, :rows, :cols]
    return data.float() * s


def _check(
    x: torch.Tensor,
    experts: Fp8Experts,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
) -> None:
    check_moe_routing("fused_moe_fp8", x, experts.w13.shape[2], topk_weights, topk_ids, activation)


def fused_moe_fp8_ref(
    x: torch.Tensor,
    experts: Fp8Experts,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
    dequantized: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Plain-torch reference of :func:`fused_moe_fp8`: the core's reference on the dequantized
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


def fused_moe_fp8(
    x: torch.Tensor,
    experts: Fp8Experts,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
    config: MoEConfig | None = None,
    dequantized: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """The expert MLP of ``x [T, H]`` → ``[T, H]`` in x's dtype over e4m3 experts (see the
    module docstring). ``config`` overrides the path and tiles
    (:func:`tallow.kernels.default_moe_config` by token count); ``dequantized`` is what the
    reference multiplies where the kernels do not run."""
    _check(x, experts, topk_weights, topk_ids, activation)
    if x.shape[0] == 0 or not kernels_run(x):
        return fused_moe_fp8_ref(
            x,
            experts,
            topk_weights,
            topk_ids,
            activation=activation,
            swiglu_alpha=swiglu_alpha,
            swiglu_limit=swiglu_limit,
            dequantized=dequantized,
        )
    from .kernels.moe import fused_moe_fp8_triton

    e, two_i, h = experts.w13.shape
    cfg = config or default_moe_config(e, two_i // 2, h, x.shape[0], FP8)
    return fused_moe_fp8_triton(
        x,
        experts.w13,
        experts.w13_scale,
        experts.w2,
        experts.w2_scale,
        experts.block,
        topk_weights,
        topk_ids,
        activation=activation,
        alpha=swiglu_alpha,
        limit=swiglu_limit,
        config=cfg,
    )
