"""How a mixture-of-experts layer stores its experts and runs them: the quantization seam.

A :class:`MoEMethod` is to :class:`~tallow.layers.FusedMoE` what a
:class:`~tallow.layers.LinearMethod` is to a linear layer: it creates the expert parameters,
may post-process them after loading, and runs the experts in ``apply``. The layer owns the
router, the shared experts, the tensor-parallel split (each rank holds ``I / tp`` of every
expert's intermediate features, or under expert parallelism ``E / tp`` whole experts, which
``create_weights`` is then asked for and ``apply`` receives local ids of) and the mapping of
checkpoint tensors onto its parameters.

The core holds :class:`UnquantizedMoEMethod` (float weights). A quantization scheme supplies
its own through an optional ``moe_method(prefix)`` factory, asked by :func:`moe_method_for`
the way ``linear_method(prefix)`` is asked for linear layers (tallow-quant-fp8, -int4, -fp4
and -gguf have theirs). Its parameters either say which dimension follows the expert index,
the output and the input (``expert_dim``, ``output_dim``, ``input_dim``) so the layer's loader
can shard them, or carry their own ``weight_loader`` (called with shard ``(expert, part)``,
part ``"gate"``, ``"up"`` or ``"down"``, or a stacked shard; with ``accepts_quantized`` it
receives still-quantized checkpoint tensors). Such a loader asks the layer
:meth:`~tallow.layers.FusedExperts.expert_tensors` which of a tensor's experts this rank holds,
and :meth:`~tallow.layers.FusedExperts.checkpoint_shape` /
:meth:`~tallow.layers.FusedExperts.weight_slices` where this rank's share of an expert goes.
The checkpoint names ``experts.{e}.gate_proj.<kind>`` reach the parameter ``w13_<kind>``
(``down_proj``: ``w2_<kind>``), so a method names its parameters after the checkpoint's
tensors (``w13_weight_scale_inv``, ``w2_qweight``...).
"""

from __future__ import annotations

from typing import Any, Protocol, cast

import torch
from torch import nn

from tallow.kernels import fused_moe

from .linear_method import set_weight_attrs


class ExpertWeights(Protocol):
    """What :meth:`MoEMethod.apply` reads of the layer it stored the experts' weights on
    (:class:`tallow.layers.fused_moe.FusedExperts`; nn.Module's attributes are untyped)."""

    w13_weight: torch.Tensor
    w2_weight: torch.Tensor
    activation: str
    swiglu_alpha: float
    swiglu_limit: float


class MoEMethod:
    """Storage and computation of a layer's routed experts (see the module docstring)."""

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
        """Register ``w13_weight`` (gate rows then up rows of each expert, this rank's share)
        and ``w2_weight`` on ``layer``, and ``w13_bias`` / ``w2_bias`` when ``bias``."""
        raise NotImplementedError

    def apply(
        self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        """This rank's partial expert output ``[T, H]`` (summed over ranks by the layer)."""
        raise NotImplementedError

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Called once after every checkpoint tensor is loaded."""


class UnquantizedMoEMethod(MoEMethod):
    """Stacked float experts ``w13 [E, 2I, H]``, ``w2 [E, H, I]`` in the build dtype, run by
    :func:`tallow.kernels.moe.fused_moe`."""

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
        def param(
            *shape: int, **attrs: Any
        ) -> nn.Parameter:  # Any: nn.Parameter attributes of any type
            p = nn.Parameter(
                torch.empty(*shape, dtype=params_dtype, device=device), requires_grad=False
            )
            set_weight_attrs(p, expert_dim=0, **attrs)
            return p

        i, h, e = intermediate_per_rank, hidden_size, num_experts
        layer.register_parameter("w13_weight", param(e, 2 * i, h, output_dim=1, input_dim=2))
        layer.register_parameter("w2_weight", param(e, h, i, output_dim=1, input_dim=2))
        if bias:
            layer.register_parameter("w13_bias", param(e, 2 * i, output_dim=1, input_dim=None))
            layer.register_parameter("w2_bias", param(e, h, output_dim=1, input_dim=None))

    def apply(
        self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor
    ) -> torch.Tensor:
        experts = cast(ExpertWeights, layer)
        return fused_moe(
            x,
            experts.w13_weight,
            experts.w2_weight,
            topk_weights,
            topk_ids,
            activation=experts.activation,
            w13_bias=getattr(layer, "w13_bias", None),
            w2_bias=getattr(layer, "w2_bias", None),
            swiglu_alpha=experts.swiglu_alpha,
            swiglu_limit=experts.swiglu_limit,
        )


def moe_method_for(
    quant: Any, prefix: str
) -> MoEMethod:  # Any: a QuantScheme or None; tallow.plugin sits above layers
    """The :class:`MoEMethod` that ``quant`` (a QuantScheme instance or None) assigns to the
    experts at ``prefix``: its ``moe_method(prefix)`` when it has one and returns a method,
    else :class:`UnquantizedMoEMethod` (schemes that quantize only linear layers leave the
    experts in float)."""
    factory = getattr(quant, "moe_method", None) if quant is not None else None
    method = factory(prefix) if factory is not None else None
    if method is None:
        return UnquantizedMoEMethod()
    if not isinstance(method, MoEMethod):
        raise TypeError(
            f"quant scheme {type(quant).__name__}.moe_method returned "
            f"{type(method).__name__} for {prefix!r}; expected a "
            "tallow.layers.MoEMethod or None"
        )
    return method
