"""The :class:`tallow.layers.MoEMethod` of MXFP4 experts (gpt-oss's published checkpoints):
the experts stay packed — 4-bit codes and a scale byte per 32 columns, a quarter of bf16's
bytes plus 1/32 — and run on :func:`tallow_quant_fp4.moe_ops.mxfp4_moe`.

Parameters on the layer (``FusedExperts``), for this tensor-parallel rank's share of every
expert's intermediate features (``I_r``):

- ``w13_blocks`` uint8 ``[E, 2 I_r, H / 32, 16]`` and ``w13_scales`` uint8 ``[E, 2 I_r, H / 32]``:
  gate rows then up rows (the model sorts gpt-oss's interleaved rows apart at load);
- ``w2_blocks`` uint8 ``[E, H, I_r / 32, 16]`` and ``w2_scales`` uint8 ``[E, H, I_r / 32]``;
- with biases, ``w13_bias`` / ``w2_bias`` in the model's dtype (loaded by the layer).

They load from the stacked checkpoint tensors (``[E, ...]``); a rank keeps its rows of the gate
and the up halves, and its 32-column blocks of the down rows, so ``I_r`` must be a multiple of
32 (gpt-oss's 2880 is 90 blocks: 2, 3, 5 or 6 ranks split it, 4 and 8 do not).
"""

from __future__ import annotations

from typing import Any, Hashable

import torch
from torch import nn

from tallow.layers import MoEMethod, set_weight_attrs

from .moe_ops import mxfp4_moe


class MXFP4MoEMethod(MoEMethod):
    """MXFP4 experts kept packed (see the module docstring)."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix

    def create_weights(
        self,
        layer: nn.Module,
        num_experts: int,
        hidden_size: int,
        intermediate_per_rank: int,
        bias: bool,
        params_dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        what = self.prefix or "MXFP4 experts"
        if hidden_size % 32 or intermediate_per_rank % 32:
            raise ValueError(
                f"{what}: MXFP4 experts need the hidden size ({hidden_size}) and "
                f"each rank's intermediate size ({intermediate_per_rank}) to be "
                "multiples of 32 (one scale per 32 columns)"
            )
        e, h, i = num_experts, hidden_size, intermediate_per_rank

        def packed(name: str, *shape: int) -> None:
            p = nn.Parameter(
                torch.zeros(*shape, dtype=torch.uint8, device=device), requires_grad=False
            )
            set_weight_attrs(p, expert_dim=0, weight_loader=self._loader(layer, name))
            layer.register_parameter(name, p)

        packed("w13_blocks", e, 2 * i, h // 32, 16)
        packed("w13_scales", e, 2 * i, h // 32)
        packed("w2_blocks", e, h, i // 32, 16)
        packed("w2_scales", e, h, i // 32)
        set_weight_attrs(
            layer.w13_blocks, random_fill=lambda gen, std: self.random_fill(layer, gen, std)
        )
        if bias:
            for name, shape in (("w13_bias", (e, 2 * i)), ("w2_bias", (e, h))):
                p = nn.Parameter(
                    torch.zeros(*shape, dtype=params_dtype, device=device), requires_grad=False
                )
                set_weight_attrs(p, expert_dim=0, output_dim=1, input_dim=None)
                layer.register_parameter(name, p)

    def _loader(self, layer: nn.Module, name: str) -> Any:
        def load(
            param: torch.Tensor, loaded: torch.Tensor, shard_id: Hashable | None = None
        ) -> None:
            what = f"{self.prefix}.{name}" if self.prefix else name
            if shard_id is not None:
                raise ValueError(
                    f"{what}: MXFP4 experts load from the stacked checkpoint "
                    f"tensor of every expert, not per expert ({shard_id!r})"
                )
            if loaded.dtype != torch.uint8:
                raise ValueError(
                    f"{what}: expected uint8 MXFP4 {name.split('_')[1]}, got {loaded.dtype}"
                )
            rank, size = layer.tp_rank, layer.intermediate_per_rank
            full = layer.intermediate_size
            if name.startswith("w13"):  # [E, 2I, ...]: this rank's gate rows and up rows
                expected = (layer.num_experts, 2 * full, *param.shape[2:])
                parts = [loaded.narrow(1, half * full + rank * size, size) for half in (0, 1)]
                src = torch.cat(parts, dim=1) if loaded.shape[1:] == expected[1:] else None
            else:  # [E, H, I / 32, ...]: this rank's 32-column blocks of every row
                expected = (layer.num_experts, param.shape[1], full // 32, *param.shape[3:])
                src = (
                    loaded.narrow(2, rank * size // 32, size // 32)
                    if loaded.shape[1:] == expected[1:]
                    else None
                )
            if tuple(loaded.shape) != expected or src is None:
                raise ValueError(
                    f"{what}: checkpoint tensor has shape {tuple(loaded.shape)}, "
                    f"expected {expected}"
                )
            with torch.no_grad():
                param.copy_(src)

        return load

    @torch.no_grad()
    def random_fill(self, layer: nn.Module, generator: torch.Generator, std: float) -> None:
        """Random codes (every byte equally likely) and scales that give the weights a standard
        deviation of about ``std`` (a ``random:`` model; e2m1 values of uniform codes have an
        RMS of about 2.9)."""
        exponent = 127 + round(torch.log2(torch.tensor(std / 2.93)).item())
        for name in ("w13", "w2"):
            blocks, scales = getattr(layer, f"{name}_blocks"), getattr(layer, f"{name}_scales")
            blocks.copy_(
                torch.randint(
                    0,
                    256,
                    blocks.shape,
                    generator=generator,
                    device=blocks.device,
                    dtype=torch.int32,
                )
            )
            scales.copy_(
                exponent
                + torch.randint(
                    -1,
                    2,
                    scales.shape,
                    generator=generator,
                    device=scales.device,
                    dtype=torch.int32,
                )
            )

    def apply(
        self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        return mxfp4_moe(
            x,
            (layer.w13_blocks, layer.w13_scales),
            (layer.w2_blocks, layer.w2_scales),
            topk_weights,
            topk_ids,
            activation=layer.activation,
            w13_bias=getattr(layer, "w13_bias", None),
            w2_bias=getattr(layer, "w2_bias", None),
            swiglu_alpha=layer.swiglu_alpha,
            swiglu_limit=layer.swiglu_limit,
        )

    def type_names(self) -> list[str]:
        return ["mxfp4 experts"]
