"""How a linear layer stores its weight and multiplies by it.

A :class:`LinearMethod` is the seam between the layer (which knows the logical shapes and how
checkpoint tensors are sharded across tensor-parallel ranks) and a quantization scheme (which
knows the storage layout and the matmul). The layer asks the method to create its parameters,
loads checkpoint tensors into them through each parameter's ``weight_loader``, lets the method
post-process them once loading is done, and calls ``apply`` in ``forward``.

A quantization scheme supplies its method through ``linear_method``: a
:class:`tallow.plugin.QuantScheme` instance placed in ``BuildContext.quant`` may define
``linear_method(prefix)`` (or ``linear_method()``) returning a :class:`LinearMethod`, or None for
layers it leaves unquantized. Without a scheme, or when it returns None, the layer uses
:class:`UnquantizedLinearMethod`. Token embeddings and the LM head ask too, through the optional
``embedding_method(prefix)`` and ``head_method(prefix)``; a scheme without them leaves those
layers unquantized. An embedding's method implements :meth:`LinearMethod.embedding` (gather
rows); a head tied to the embedding multiplies by the embedding's storage through the
embedding's method.

Sharding attributes. Every parameter a method creates says which of its dimensions follow the
layer's logical output and input (``output_dim``, ``input_dim``; None when the parameter is not
sharded along it, e.g. a per-tensor scale). The layer's loader slices checkpoint tensors along
those dimensions in proportion to the parameter's own extent, so a packed or grouped layout
(a scale per group of 128 inputs, say) shards correctly without further help. A method whose
parameters need other handling attaches its own ``weight_loader(param, loaded, shard_id=None)``;
the layer leaves such a loader in place. A parameter that no checkpoint tensor fills directly
(a scale computed while quantizing ``weight`` at load time, say) is marked
``from_checkpoint=False`` so that the model's completeness check does not report it missing.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Hashable, Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn

from tallow.kernels.linear import gated_gemv, gated_gemv_fits
from tallow.kernels.linear import linear as dense_linear


@dataclass(frozen=True)
class WeightSlice:
    """The part of a checkpoint tensor that one output partition of this rank holds (defined
    here, below :mod:`tallow.layers.linear`, which re-exports it, for :class:`ShardedWeights`): rows
    ``rows[0]:rows[1]`` (output features) and columns ``cols[0]:cols[1]`` (input features; None
    for all of them), followed by ``pad_rows`` rows of zeros (the tail of the last shard of a
    vocabulary that does not divide evenly)."""

    partition: int
    rows: tuple[int, int]
    cols: tuple[int, int] | None = None
    pad_rows: int = 0


class ShardedWeights(Protocol):
    """What a method may ask of the layer it stores weights for (every linear layer, the
    vocabulary embedding and the head): how the checkpoint's tensors map onto this rank."""

    def checkpoint_shape(self, shard_id: Hashable | None = None) -> tuple[int, int]: ...

    def weight_slices(self, shard_id: Hashable | None = None) -> list[WeightSlice]: ...


def sharded_weights(layer: nn.Module) -> ShardedWeights:
    """``layer`` as the owner of sharded weights (nn.Module's attributes are untyped)."""
    return cast(ShardedWeights, layer)


def dense_weight(layer: nn.Module) -> torch.Tensor:
    """The float weight a dense method registered on ``layer``."""
    return cast(torch.Tensor, layer.weight)


class LinearMethod:
    """Storage and matmul of one linear layer (see the module docstring)."""

    def create_weights(
        self,
        layer: nn.Module,
        input_size: int,
        output_sizes: list[int],
        params_dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        """Register the parameters of ``layer``.

        ``input_size`` is this rank's share of the input features; ``output_sizes`` this rank's
        share of each output partition (one entry for a plain layer; q/k/v or gate/up for
        merged ones), laid out one after the other along the output dimension.
        """
        raise NotImplementedError

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``x [..., input_size] -> [..., sum(output_sizes)]``, plus ``bias`` when given."""
        raise NotImplementedError

    def apply_gated(
        self, layer: nn.Module, x: torch.Tensor, act: nn.Module, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """``apply(act(x))`` where ``act`` maps a merged ``[gate | up]`` input to
        ``act(gate) * up`` (the down projection of a gated MLP). A method may fuse the two;
        this default runs them one after the other."""
        return self.apply(layer, act(x), bias)

    def embedding(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids [T]`` of the weight, ``[T, input_size]`` in the layer's dtype (a token
        embedding: ``output_sizes`` are vocabulary rows). Methods for embeddings implement it."""
        raise NotImplementedError(f"{type(self).__name__} does not store token embeddings")

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Called once after every checkpoint tensor is loaded (repacking, transposes...)."""


class UnquantizedLinearMethod(LinearMethod):
    """A dense ``weight [out, in]`` in the build dtype; ``forward`` is
    :func:`tallow.kernels.linear.linear` (a Triton GEMV for decode-size inputs on a GPU,
    ``F.linear`` otherwise)."""

    def create_weights(
        self,
        layer: nn.Module,
        input_size: int,
        output_sizes: list[int],
        params_dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        weight = nn.Parameter(
            torch.empty(sum(output_sizes), input_size, dtype=params_dtype, device=device),
            requires_grad=False,
        )
        set_weight_attrs(weight, output_dim=0, input_dim=1)
        layer.register_parameter("weight", weight)

    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        return dense_linear(x, dense_weight(layer), bias)

    def embedding(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, dense_weight(layer))

    def apply_gated(
        self, layer: nn.Module, x: torch.Tensor, act: nn.Module, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """A one-row input on a GPU takes the GEMV that computes ``act(gate) * up`` as it
        reads its input (one launch and no intermediate tensor at batch 1); see
        :func:`tallow.kernels.linear.gated_linear`."""
        kind = getattr(act, "kind", None)
        weight = dense_weight(layer)
        if kind is None or not gated_gemv_fits(x, weight, bias):
            return self.apply(layer, act(x), bias)
        return gated_gemv(x, weight, bias, kind=kind)


def set_weight_attrs(param: torch.Tensor, **attrs: object) -> None:
    """Attach loading metadata (``output_dim``, ``input_dim``, ``weight_loader``...) to ``param``.

    Refuses to overwrite an attribute already set, which would silently change how the
    parameter loads.
    """
    for key, value in attrs.items():
        if hasattr(param, key):
            raise AttributeError(f"parameter already has attribute {key!r}")
        setattr(param, key, value)


#: the factory a scheme may define for each kind of layer, tried in order
_FACTORIES = {
    "linear": ("linear_method",),
    "head": ("head_method",),
    "embedding": ("embedding_method",),
}


def linear_method_for(quant: object, prefix: str, role: str = "linear") -> LinearMethod:
    """The :class:`LinearMethod` that ``quant`` (a QuantScheme instance or None) assigns to the
    layer at ``prefix``; :class:`UnquantizedLinearMethod` when it assigns none. ``role`` is
    ``"linear"``, ``"head"`` (the LM head) or ``"embedding"`` (token embeddings): see the
    module docstring for the factory each asks."""
    if role not in _FACTORIES:
        raise ValueError(f"role must be one of {', '.join(_FACTORIES)}, got {role!r}")
    if quant is None:
        return UnquantizedLinearMethod()
    factory = next(
        (f for f in (getattr(quant, n, None) for n in _FACTORIES[role]) if f is not None), None
    )
    if factory is None:
        return UnquantizedLinearMethod()
    try:
        takes_prefix = bool(inspect.signature(factory).parameters)
    except (TypeError, ValueError):  # builtins without a signature: assume the documented form
        takes_prefix = True
    method = factory(prefix) if takes_prefix else factory()
    if method is None:
        return UnquantizedLinearMethod()
    if not isinstance(method, LinearMethod):
        raise TypeError(
            f"quant scheme {type(quant).__name__}.linear_method returned "
            f"{type(method).__name__} for layer {prefix!r}; expected a "
            "tallow.layers.LinearMethod or None"
        )
    return method
