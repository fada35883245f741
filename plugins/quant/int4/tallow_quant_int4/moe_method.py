"""The MoEMethod of the ``int4`` scheme: a FusedMoE layer's routed experts kept as integer
codes (:mod:`tallow_quant_int4.moe_ops`).

Checkpoints store each expert's projections as a linear layer of their format: GPTQ
``experts.{e}.gate_proj.qweight`` / ``qzeros`` / ``scales`` (/ ``g_idx``), AWQ the same names in
its packing, compressed-tensors ``weight_packed`` / ``weight_scale`` / ``weight_zero_point`` /
``weight_shape`` (llm-compressor's and AutoAWQ-converted "pack-quantized" MoE models). They
reach placeholders named ``w13_<tensor>`` / ``w2_<tensor>`` and are kept by (expert, part)
until loading ends; then each is unpacked (:mod:`tallow_quant_int4.formats`), this rank's rows
of gate and up or columns of down cut out (:meth:`tallow.layers.FusedExperts.weight_slices`),
repacked into the layout and stacked. Act-order (``g_idx`` that is not the natural order) is
refused: every expert would read its input in its own order.

Under ``model.isq int4`` each expert's float rows are rounded to nearest as they arrive
(:func:`tallow_quant_int4.isq.quantize_rtn`, the recipe's group size, zero points and clipping;
the GPTQ calibration is for linear layers), and a ``random:`` model draws and rounds one expert
at a time. Expert biases are refused.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Hashable

import torch
from torch import nn

from tallow.kernels import triton_enabled
from tallow.layers import MoEMethod, set_weight_attrs

from .formats import Unpacked
from .layout import IntWeight, cat_rows
from .method import _slice, _unpack
from .moe_ops import IntExperts, StackedInt, fused_moe_int

if TYPE_CHECKING:  # pragma: no cover
    from .scheme import IntQuantScheme

_PARTS = {"w13": ("gate", "up"), "w2": ("down",)}


class IntMoEMethod(MoEMethod):
    """Integer experts (see the module docstring)."""

    def __init__(self, scheme: "IntQuantScheme", prefix: str) -> None:
        self.scheme = scheme
        self.prefix = prefix
        self.layout = scheme.layout  # None under model.isq
        self.pending: dict[tuple[str, int, str], dict[str, torch.Tensor]] = {}
        self.ready: dict[tuple[str, int, str], IntWeight] = {}
        self.experts: IntExperts | None = None
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
            raise ValueError(f"{self.prefix}: integer experts with biases are not supported")
        self.layer = layer
        self.num_experts = num_experts
        self.i_rank = intermediate_per_rank
        self.device = torch.device(device)
        names = self.layout.tensors if self.layout is not None else ()
        required = self.layout.required if self.layout is not None else ()
        for stacked in _PARTS:
            for name in ("weight", *names):
                p = nn.Parameter(
                    torch.empty(0, dtype=torch.uint8, device=device), requires_grad=False
                )
                set_weight_attrs(
                    p,
                    weight_loader=partial(self._load, stacked, name),
                    from_checkpoint=name in required
                    or (name == "weight" and bool(self.scheme.isq)),
                )
                if name == "weight" and self.scheme.isq:
                    set_weight_attrs(p, random_fill=partial(self._random_fill, stacked))
                layer.register_parameter(f"{stacked}_{name}", p)

    def _load(
        self,
        stacked: str,
        name: str,
        param: torch.Tensor,
        loaded: torch.Tensor,
        shard_id: Hashable | None = None,
    ) -> None:
        for e, part, src in self.layer.expert_tensors(loaded, shard_id, stacked):
            key = (stacked, e, part)
            if name != "weight":
                tensors = self.pending.setdefault(key, {})
                if name in tensors:
                    raise ValueError(f"{self.prefix}: expert {e} {part} {name} loaded twice")
                tensors[name] = src
                continue
            if not self.scheme.isq:
                raise ValueError(
                    f"{self.prefix}: expert {e} {part} is a float weight in an "
                    "integer checkpoint; float experts are not supported beside "
                    "quantized layers"
                )
            expected = self.layer.checkpoint_shape(part)
            if tuple(src.shape) != expected:
                raise ValueError(
                    f"{self.prefix}: expert {e} {part} weight has shape "
                    f"{tuple(src.shape)}, expected {expected}"
                )
            [sl] = self.layer.weight_slices(part)
            (r0, r1), (c0, c1) = sl.rows, sl.cols or (0, expected[1])
            self.ready[key] = self._round(src[r0:r1, c0:c1], f"expert {e} {part}")

    def _round(self, weight: torch.Tensor, what: str) -> IntWeight:
        from .isq import quantize_rtn

        q = quantize_rtn(weight, self.device, replace(self.scheme.recipe, method="rtn"))
        if q is None:
            raise ValueError(
                f"{self.prefix}: {what} has {weight.shape[1]} columns, which no "
                "group size of model.isq int4 divides"
            )
        return q

    @torch.no_grad()
    def _random_fill(self, stacked: str, generator: torch.Generator, std: float) -> None:
        """Float experts ~ N(0, std) drawn and rounded one expert at a time."""
        h = self.layer.hidden_size
        for e in range(self.num_experts):
            for part in _PARTS[stacked]:
                rows, cols = (h, self.i_rank) if part == "down" else (self.i_rank, h)
                w = torch.empty(rows, cols, dtype=torch.float32, device=self.device)
                w.normal_(0.0, std, generator=generator)
                self.ready[(stacked, e, part)] = self._round(w, f"expert {e} {part}")

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        for (stacked, e, part), tensors in self.pending.items():
            what = f"{self.prefix} expert {e} {part}"
            assert self.layout is not None
            missing = [t for t in self.layout.required if t not in tensors]
            if missing:
                raise ValueError(f"{what}: the checkpoint lacks {', '.join(missing)}")
            shape = self.layer.checkpoint_shape(part)
            unpacked = _natural_order(_unpack(self.layout, tensors, shape, self.device, what), what)
            [sl] = self.layer.weight_slices(part)
            self.ready[(stacked, e, part)] = _slice(unpacked, sl, what)
        self.pending = {}
        stacks = {}
        for stacked, parts in _PARTS.items():
            per_expert = []
            for e in range(self.num_experts):
                pieces = [self.ready.get((stacked, e, part)) for part in parts]
                if any(p is None for p in pieces):
                    raise ValueError(f"{self.prefix}: expert {e} {stacked} was never loaded")
                per_expert.append(cat_rows(pieces) if len(pieces) > 1 else pieces[0])
            stacks[stacked] = StackedInt.stack(per_expert, f"{self.prefix} {stacked}")
        self.ready = {}
        self.experts = IntExperts(stacks["w13"], stacks["w2"])
        for stacked, w in stacks.items():
            for name, t in (("codes", w.codes), ("scales", w.scales), ("zeros", w.zeros)):
                if t is not None:
                    layer.register_buffer(f"{stacked}_int_{name}", t, persistent=False)
        self.scheme.moe_methods.append(self)

    def type_names(self) -> list[str]:
        return [] if self.experts is None else [f"experts {self.experts.type_name}"]

    # -- compute ---------------------------------------------------------------------------
    def apply(
        self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        if self.experts is None:
            raise RuntimeError(f"{self.prefix}: the experts are not loaded")
        dequantized = None
        if not triton_enabled(x):  # the reference: decode once (a CPU)
            if self._dequantized is None:
                self._dequantized = self.experts.dequantize(torch.float32)
            dequantized = self._dequantized
        return fused_moe_int(
            x,
            self.experts,
            topk_weights,
            topk_ids,
            activation=getattr(layer, "activation"),
            swiglu_alpha=getattr(layer, "swiglu_alpha"),
            swiglu_limit=getattr(layer, "swiglu_limit"),
            dequantized=dequantized,
        )


def _natural_order(u: Unpacked, what: str) -> Unpacked:
    """``u`` without its ``g_idx`` when that is the natural order (GPTQ writes one anyway);
    ``ValueError`` for act-order columns, which stacked experts cannot hold."""
    if u.group_index is None:
        return u
    cols = u.codes.shape[1]
    natural = torch.arange(cols, device=u.group_index.device) // (cols // u.scales.shape[1])
    if not torch.equal(u.group_index.long(), natural):
        raise ValueError(
            f"{what}: act-order (g_idx) columns are not supported for experts "
            "(every expert would read its input in its own order)"
        )
    return Unpacked(u.codes, u.scales, u.zeros, u.bits, None)
