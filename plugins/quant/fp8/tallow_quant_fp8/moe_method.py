"""The MoEMethod of the ``fp8`` scheme: a FusedMoE layer's routed experts kept as e4m3.

Storage: ``w13_weight [E, 2I/tp, H]`` and ``w2_weight [E, H, I/tp]`` (e4m3) with their scales,
per output row (``[E, rows]``) or per 128 x 128 block (``[E, rows/128, cols/128]``), named after
the checkpoint's tensors so that ``experts.{e}.gate_proj.weight_scale_inv`` reaches
``w13_weight_scale_inv``:

- HF ``fp8`` with ``weight_block_size: [128, 128]`` (Qwen3-30B-A3B-FP8, DeepSeek-V3):
  ``weight_scale_inv`` per block; compressed-tensors ``FP8_BLOCK``: ``weight_scale`` per block;
- HF ``fp8`` per tensor and compressed-tensors ``FP8`` (a scalar ``weight_scale`` per expert
  and projection, repeated over its rows) and ``FP8_DYNAMIC`` (``weight_scale [rows, 1]``):
  one scale per row;
- ``model.isq fp8``: each expert's float rows quantized as they arrive (``amax / 448`` per
  row); a ``random:`` model draws and quantizes one expert at a time.

Each loader writes this rank's share of one expert's tensor (its rows of gate and up, its
columns of down: :meth:`tallow.layers.FusedExperts.weight_slices`) into the stacked
parameters, so no float copy of the experts exists. Static ``input_scale`` tensors of W8A8
checkpoints are read and dropped: the experts are weight-only (the activations are not
quantized, :mod:`tallow_quant_fp8.moe_ops`). Expert biases are refused.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, Hashable

import torch
from torch import nn

from tallow.layers import MoEMethod, set_weight_attrs

from .moe_ops import Fp8Experts, fused_moe_fp8
from .ops import kernels_run
from .weights import BLOCK, FP8, quantize_rows

if TYPE_CHECKING:  # pragma: no cover
    from .scheme import Fp8QuantScheme

_PARTS = {"w13": ("gate", "up"), "w2": ("down",)}


class Fp8MoEMethod(MoEMethod):
    """e4m3 experts with float32 scales (see the module docstring)."""

    def __init__(self, scheme: "Fp8QuantScheme", prefix: str) -> None:
        self.scheme = scheme
        self.prefix = prefix
        fmt = scheme.checkpoint
        self.layout = "block" if fmt is not None and fmt.block else "row"
        self.per_tensor = fmt is not None and fmt.weights == "tensor"
        self.scale_name = fmt.scale_name if fmt is not None and not scheme.isq else "weight_scale"
        self.experts: Fp8Experts | None = None
        self._dequantized: tuple[torch.Tensor, torch.Tensor] | None = None

    # -- storage ---------------------------------------------------------------------------
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
        if bias:
            raise ValueError(f"{self.prefix}: fp8 experts with biases are not supported")
        if self.layout == "block" and intermediate_per_rank % BLOCK:
            raise ValueError(
                f"{self.prefix}: block-scaled fp8 experts need each rank's "
                f"intermediate size to be a multiple of {BLOCK}, got "
                f"{intermediate_per_rank}"
            )
        self.layer = layer
        self.num_experts = num_experts
        self.i_rank = intermediate_per_rank
        shapes = {
            "w13": (2 * intermediate_per_rank, hidden_size),
            "w2": (hidden_size, intermediate_per_rank),
        }
        for name, (rows, cols) in shapes.items():
            weight = nn.Parameter(
                torch.empty(num_experts, rows, cols, dtype=FP8, device=device), requires_grad=False
            )
            set_weight_attrs(weight, weight_loader=partial(self._load_weight, name))
            if self.scheme.isq:
                set_weight_attrs(weight, random_fill=self._random_fill(name))
            layer.register_parameter(f"{name}_weight", weight)
            scale_shape = (
                (num_experts, rows)
                if self.layout == "row"
                else (num_experts, -(-rows // BLOCK), -(-cols // BLOCK))
            )
            scale = torch.full(scale_shape, float("nan"), dtype=torch.float32, device=device)
            if self.scheme.isq:  # made with the weight: not a checkpoint tensor
                layer.register_buffer(f"{name}_weight_scale", scale)
            else:
                param = nn.Parameter(scale, requires_grad=False)
                set_weight_attrs(param, weight_loader=partial(self._load_scale, name))
                layer.register_parameter(f"{name}_{self.scale_name}", param)
                # W8A8 checkpoints' static activation scales: read and dropped (weight-only)
                drop = nn.Parameter(torch.empty(0, device=device), requires_grad=False)
                set_weight_attrs(drop, weight_loader=_drop, from_checkpoint=False)
                layer.register_parameter(f"{name}_input_scale", drop)

    def _scale_of(self, name: str) -> torch.Tensor:
        scale = getattr(self.layer, f"{name}_weight_scale", None)
        if scale is None:
            scale = getattr(self.layer, f"{name}_{self.scale_name}")
        return scale

    def _load_weight(
        self, name: str, param: torch.Tensor, loaded: torch.Tensor, shard_id: Hashable | None = None
    ) -> None:
        scale = self._scale_of(name)
        for e, part, src in self.layer.expert_tensors(loaded, shard_id, name):
            expected = self.layer.checkpoint_shape(part)
            if tuple(src.shape) != expected:
                raise ValueError(
                    f"{self.prefix}: expert {e} {part} weight has shape "
                    f"{tuple(src.shape)}, expected {expected}"
                )
            [sl] = self.layer.weight_slices(part)
            (r0, r1), (c0, c1) = sl.rows, sl.cols or (0, expected[1])
            rows = slice(sl.partition * self.i_rank, sl.partition * self.i_rank + r1 - r0)
            piece = src[r0:r1, c0:c1]
            if piece.dtype == FP8:  # copied as bytes: not every device copies float8
                param.data[e, rows].view(torch.uint8).copy_(piece.view(torch.uint8))
            elif not piece.is_floating_point():
                raise ValueError(
                    f"{self.prefix}: expert {e} {part} weight is {piece.dtype}; "
                    "expected float8 e4m3 (or a float weight under model.isq fp8)"
                )
            elif self.scheme.isq:
                q = quantize_rows(piece.to(param.device))
                param.data[e, rows].view(torch.uint8).copy_(q.data.view(torch.uint8))
                scale.data[e, rows] = q.scale
            else:
                raise ValueError(
                    f"{self.prefix}: expert {e} {part} weight is {piece.dtype} in "
                    "an fp8 checkpoint; float experts beside float8 layers are "
                    "not supported"
                )

    def _load_scale(
        self, name: str, param: torch.Tensor, loaded: torch.Tensor, shard_id: Hashable | None = None
    ) -> None:
        for e, part, src in self.layer.expert_tensors(loaded, shard_id, name):
            rows_full, cols_full = self.layer.checkpoint_shape(part)
            [sl] = self.layer.weight_slices(part)
            (r0, r1), (c0, c1) = sl.rows, sl.cols or (0, cols_full)
            at = f"{self.prefix}: expert {e} {part} {self.scale_name}"
            s = src.float().to(param.device)
            start = sl.partition * self.i_rank
            if self.layout == "block":
                expected = (-(-rows_full // BLOCK), -(-cols_full // BLOCK))
                if tuple(s.shape) != expected:
                    raise ValueError(
                        f"{at}: expected block scales {expected}, got {tuple(s.shape)}"
                    )
                piece = s[r0 // BLOCK : -(-r1 // BLOCK), c0 // BLOCK : -(-c1 // BLOCK)]
                param.data[e, start // BLOCK : start // BLOCK + piece.shape[0]] = piece
            elif self.per_tensor:
                if s.numel() != 1:
                    raise ValueError(
                        f"{at}: a per-tensor scale holds one value, got shape {tuple(s.shape)}"
                    )
                param.data[e, start : start + r1 - r0] = s.reshape(())
            else:
                if s.numel() != rows_full or (s.dim() == 2 and s.shape[1] != 1):
                    raise ValueError(
                        f"{at}: a per-channel scale must have shape "
                        f"({rows_full}, 1), got {tuple(s.shape)}"
                    )
                param.data[e, start : start + r1 - r0] = s.reshape(rows_full)[r0:r1]

    def _random_fill(self, name: str) -> Any:
        @torch.no_grad()
        def fill(generator: torch.Generator, std: float) -> None:
            """Float experts ~ N(0, std) drawn and quantized one expert at a time."""
            weight = getattr(self.layer, f"{name}_weight")
            scale = self._scale_of(name)
            for e in range(self.num_experts):
                w = torch.empty(weight.shape[1:], dtype=torch.float32, device=weight.device)
                w.normal_(0.0, std, generator=generator)
                q = quantize_rows(w)
                weight.data[e].view(torch.uint8).copy_(q.data.view(torch.uint8))
                scale.data[e] = q.scale

        return fill

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        scales = {name: self._scale_of(name) for name in _PARTS}
        for name, scale in scales.items():
            if torch.isnan(scale).any():
                e = int(torch.isnan(scale).reshape(scale.shape[0], -1).any(1).nonzero()[0])
                raise ValueError(
                    f"{self.prefix}: expert {e} of {name} has no weight scale "
                    "(the checkpoint lacks it)"
                )
        self.experts = Fp8Experts(
            layer.w13_weight.data,
            scales["w13"].data,
            layer.w2_weight.data,
            scales["w2"].data,
            self.layout,
        )
        self.scheme.moe_methods.append(self)

    # -- compute ---------------------------------------------------------------------------
    def apply(
        self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        if self.experts is None:
            raise RuntimeError(f"{self.prefix}: the experts are not loaded")
        dequantized = None
        if not kernels_run(x):  # the reference: dequantize once (slow on a CPU)
            if self._dequantized is None:
                self._dequantized = self.experts.dequantize(
                    torch.float32 if x.device.type == "cpu" else x.dtype
                )
            dequantized = self._dequantized
        return fused_moe_fp8(
            x,
            self.experts,
            topk_weights,
            topk_ids,
            activation=getattr(layer, "activation"),
            swiglu_alpha=getattr(layer, "swiglu_alpha"),
            swiglu_limit=getattr(layer, "swiglu_limit"),
            dequantized=dequantized,
        )


def _drop(param: torch.Tensor, loaded: torch.Tensor, shard_id: Hashable | None = None) -> None:
    """A checkpoint tensor the weight-only experts do not use."""
