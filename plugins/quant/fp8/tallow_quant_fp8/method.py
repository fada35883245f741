"""The LinearMethod of the ``fp8`` scheme: a layer's weight as e4m3 with float32 scales.

Loading. A checkpoint names a layer's pieces separately, per partition (q/k/v, gate/up):
``weight`` (e4m3), its scale (``weight_scale``, or ``weight_scale_inv`` for the block-wise HF
dialect) and, with static activation scales, ``input_scale``. They arrive in any order, so the
loaders keep each partition's pieces (this rank's rows and columns, on the layer's device) and
:meth:`Fp8LinearMethod.process_weights_after_loading` assembles them into one
:class:`~tallow_quant_fp8.weights.Fp8Weight` per layer: a per-tensor scale is repeated over its
partition's rows, partitions are stacked, static input scales become their maximum. A layer
whose checkpoint weight is not float8 (a head the quantizer left out) stays dense in the build
dtype. Under ``model.isq fp8`` every float weight is quantized as it arrives (one scale per
row), and a ``random:`` model draws and quantizes its weights a slice of rows at a time.

The pieces are registered as buffers of the layer (``qweight``, ``qscale``, ``qinput_scale``)
so memory accounting sees them; the ``weight`` parameter (and the scale parameters) are empty
placeholders that carry the loaders.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Hashable

import torch
from torch import nn

from tallow.kernels import dense_linear
from tallow.layers import LinearMethod, QuantizedWeight, WeightSlice, set_weight_attrs

from . import ops
from .weights import BLOCK, FP8, Fp8Weight, cat_rows, from_quantized, quantize_rows

if TYPE_CHECKING:  # pragma: no cover
    from .scheme import Fp8QuantScheme

#: rows drawn and quantized at a time by random initialisation
RANDOM_CHUNK_ROWS = 8192


class _Partition:
    """What has arrived for one output partition on this rank."""

    def __init__(self) -> None:
        self.data: torch.Tensor | None = None  # e4m3, or float for a dense partition
        self.scale: torch.Tensor | None = None  # float32: [1], [rows] or block scales
        self.input_scale: torch.Tensor | None = None
        self.ready: Fp8Weight | None = None  # quantized at load (isq, random, QuantizedWeight)
        self.pad_rows = 0


class Fp8LinearMethod(LinearMethod):
    """e4m3 weights with float32 scales (see the module docstring)."""

    def __init__(self, scheme: "Fp8QuantScheme", prefix: str) -> None:
        self.scheme = scheme
        self.prefix = prefix
        self.weight: Fp8Weight | None = None
        self.dense: torch.Tensor | None = None
        self.plan: ops.LayerPlan | None = None
        self.layer: nn.Module | None = None
        self._parts: list[_Partition] = []
        self._warm_gates: set[str] = set()

    @property
    def _what(self) -> str:
        return self.prefix or type(self.layer).__name__

    # -- storage ---------------------------------------------------------------------------
    def create_weights(
        self,
        layer: nn.Module,
        input_size: int,
        output_sizes: list[int],
        params_dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.layer = layer
        self.input_size = input_size
        self.output_sizes = list(output_sizes)
        self.dtype = params_dtype
        self.device = torch.device(device)
        self._parts = [_Partition() for _ in output_sizes]
        weight = self._placeholder(layer, "weight", self._load_weight)
        set_weight_attrs(weight, output_dim=0, input_dim=1, accepts_quantized=True)
        if self.scheme.isq:
            set_weight_attrs(weight, random_fill=self.random_fill)
            return
        fmt = self.scheme.checkpoint
        if fmt is None:  # no checkpoint config: fp8 QuantizedWeights carry their scales
            return
        # a layer the quantizer left out has neither: their absence is checked here, after
        # loading, against the weight's dtype
        scale = self._placeholder(layer, fmt.scale_name, self._load_scale)
        set_weight_attrs(scale, from_checkpoint=False)
        if fmt.activations == "static":
            inputs = self._placeholder(layer, "input_scale", self._load_input_scale)
            set_weight_attrs(inputs, from_checkpoint=False)

    def _placeholder(self, layer: nn.Module, name: str, loader: Any) -> nn.Parameter:
        param = nn.Parameter(
            torch.empty(0, dtype=torch.uint8, device=self.device), requires_grad=False
        )
        set_weight_attrs(param, weight_loader=loader)
        layer.register_parameter(name, param)
        return param

    def _weight_slices(self, loaded: Any, shard_id: Hashable | None) -> list[WeightSlice]:
        """Where this rank's parts of the checkpoint weight ``loaded`` go, after checking its
        shape."""
        expected = tuple(self.layer.checkpoint_shape(shard_id))
        if tuple(loaded.shape) != expected:
            shard = "" if shard_id is None else f" shard {shard_id!r}"
            raise ValueError(
                f"{self._what}{shard}: checkpoint tensor has shape "
                f"{tuple(loaded.shape)}, expected {expected}"
            )
        return self.layer.weight_slices(shard_id)

    def _load_weight(
        self, param: torch.Tensor, loaded: Any, shard_id: Hashable | None = None
    ) -> None:
        if isinstance(loaded, QuantizedWeight):
            if loaded.scheme != "fp8":  # an encoding these kernels do not read
                loaded = loaded.dequantize()
            else:
                loaded = from_quantized(loaded.data, loaded.qtype, loaded.shape)
        for part in self._weight_slices(loaded, shard_id):
            slot = self._parts[part.partition]
            if slot.data is not None or slot.ready is not None:
                raise ValueError(f"{self._what}: output partition {part.partition} is loaded twice")
            slot.pad_rows = part.pad_rows
            (r0, r1), (c0, c1) = part.rows, part.cols or (0, self.input_size)
            if isinstance(loaded, Fp8Weight):
                ready = _slice_weight(loaded, r0, r1, c0, c1, self._what)
                slot.ready = Fp8Weight(
                    _fp8_on(ready.data, self.device),
                    ready.scale.to(self.device).contiguous(),
                    ready.layout,
                )
            elif loaded.dtype == FP8:
                slot.data = _fp8_on(loaded[r0:r1, c0:c1], self.device)
            elif not loaded.is_floating_point():
                raise ValueError(
                    f"{self._what}: expected a float8 e4m3 or float weight, got {loaded.dtype}"
                )
            elif self.scheme.isq:
                slot.ready = quantize_rows(loaded[r0:r1, c0:c1].to(self.device))
            else:  # left unquantized by the checkpoint
                slot.data = loaded[r0:r1, c0:c1].to(self.device, self.dtype)

    def _load_scale(
        self, param: torch.Tensor, loaded: torch.Tensor, shard_id: Hashable | None = None
    ) -> None:
        kind = self.scheme.checkpoint.weights
        rows, cols = self.layer.checkpoint_shape(shard_id)
        shard = "" if shard_id is None else f" shard {shard_id!r}"
        scale = loaded.float()
        if kind == "tensor":
            if scale.numel() != 1:
                raise ValueError(
                    f"{self._what}{shard}: a per-tensor weight scale must hold one "
                    f"value, got shape {tuple(loaded.shape)}"
                )
        elif kind == "channel":
            if scale.numel() != rows or (scale.dim() == 2 and scale.shape[1] != 1):
                raise ValueError(
                    f"{self._what}{shard}: a per-channel weight scale must have "
                    f"shape ({rows}, 1), got {tuple(loaded.shape)}"
                )
            scale = scale.reshape(rows)
        else:
            expected = (-(-rows // BLOCK), -(-cols // BLOCK))
            if tuple(scale.shape) != expected:
                raise ValueError(
                    f"{self._what}{shard}: block-wise weight scales of a "
                    f"[{rows}, {cols}] weight must have shape {expected}, got "
                    f"{tuple(loaded.shape)}"
                )
        for part in self.layer.weight_slices(shard_id):
            slot = self._parts[part.partition]
            (r0, r1), (c0, c1) = part.rows, part.cols or (0, cols)
            if kind == "tensor":
                piece = scale.reshape(1)
            elif kind == "channel":
                piece = scale[r0:r1]
            else:
                if r0 % BLOCK or c0 % BLOCK:
                    raise ValueError(
                        f"{self._what}: this rank's rows {r0}:{r1} and columns "
                        f"{c0}:{c1} must start on {BLOCK}-element block "
                        "boundaries of the block-wise weight"
                    )
                piece = scale[r0 // BLOCK : -(-r1 // BLOCK), c0 // BLOCK : -(-c1 // BLOCK)]
            slot.scale = piece.to(self.device).contiguous()

    def _load_input_scale(
        self, param: torch.Tensor, loaded: torch.Tensor, shard_id: Hashable | None = None
    ) -> None:
        if loaded.numel() != 1:
            raise ValueError(
                f"{self._what}: a static input scale must hold one value, got "
                f"shape {tuple(loaded.shape)}"
            )
        for part in self.layer.weight_slices(shard_id):
            self._parts[part.partition].input_scale = loaded.float().reshape(()).to(self.device)

    @torch.no_grad()
    def random_fill(self, generator: torch.Generator, std: float) -> None:
        """Random float weights ~ N(0, std), quantized as they are drawn (``random:`` models
        under ``model.isq fp8``): at most :data:`RANDOM_CHUNK_ROWS` float rows exist at a
        time."""
        for slot, rows in zip(self._parts, self.output_sizes):
            pieces = []
            for start in range(0, rows, RANDOM_CHUNK_ROWS):
                w = torch.empty(
                    min(RANDOM_CHUNK_ROWS, rows - start),
                    self.input_size,
                    dtype=torch.float32,
                    device=self.device,
                )
                w.normal_(0.0, std, generator=generator)
                pieces.append(quantize_rows(w))
                del w
            slot.ready = cat_rows(pieces)

    # -- assembly --------------------------------------------------------------------------
    def process_weights_after_loading(self, layer: nn.Module) -> None:
        missing = [i for i, p in enumerate(self._parts) if p.data is None and p.ready is None]
        if missing:
            raise ValueError(f"{self._what}: output partition(s) {missing} were never loaded")
        parts = [self._assemble(i, p) for i, p in enumerate(self._parts)]
        dense = [isinstance(p, torch.Tensor) for p in parts]
        if all(dense):
            self.dense = torch.cat(parts) if len(parts) > 1 else parts[0]
            layer.register_buffer("dense_weight", self.dense, persistent=False)
        elif any(dense):
            raise ValueError(
                f"{self._what}: partitions {[i for i, d in enumerate(dense) if d]} "
                "are not float8 in the checkpoint while the others are; a merged "
                "layer must be quantized alike"
            )
        else:
            self.weight = cat_rows(parts)
            self._check_shape(self.weight)
            layer.register_buffer("qweight", self.weight.data, persistent=False)
            layer.register_buffer("qscale", self.weight.scale, persistent=False)
            if self.weight.input_scale is not None:
                layer.register_buffer("qinput_scale", self.weight.input_scale, persistent=False)
            self.plan = self._plan(self.weight)
            ops.warm_up(self.weight, self.plan, self.dtype, self.scheme.settings)
        self._parts = []

    def _assemble(self, index: int, p: _Partition) -> Fp8Weight | torch.Tensor:
        rows = self.output_sizes[index]
        if p.ready is not None:
            weight = p.ready
        elif p.data.dtype != FP8:
            if p.scale is not None:
                raise ValueError(
                    f"{self._what}: partition {index} has a weight scale but its "
                    f"weight is {p.data.dtype}, not float8 e4m3"
                )
            dense = _pad(p.data, p.pad_rows)
            if tuple(dense.shape) != (rows, self.input_size):
                raise ValueError(
                    f"{self._what}: partition {index} holds "
                    f"{list(dense.shape)}, expected [{rows}, {self.input_size}]"
                )
            return dense
        else:
            fmt = self.scheme.checkpoint
            if p.scale is None or fmt is None:
                name = fmt.scale_name if fmt is not None else "weight scale"
                raise ValueError(
                    f"{self._what}: partition {index} is float8 but the checkpoint "
                    f"has no {name} for it"
                )
            layout = "block" if fmt.block else "row"
            scale = (
                p.scale.expand(p.data.shape[0]).contiguous()
                if layout == "row" and p.scale.numel() == 1
                else p.scale
            )
            if fmt.activations == "static" and p.input_scale is None:
                raise ValueError(
                    f"{self._what}: partition {index} has no input_scale, which "
                    "static activation quantization needs"
                )
            weight = Fp8Weight(p.data, scale, layout, p.input_scale)
        if p.pad_rows:
            weight = _pad_weight(weight, p.pad_rows)
        if weight.rows != rows or weight.cols != self.input_size:
            raise ValueError(
                f"{self._what}: partition {index} holds [{weight.rows}, "
                f"{weight.cols}], expected [{rows}, {self.input_size}]"
            )
        return weight

    def _check_shape(self, weight: Fp8Weight) -> None:
        if weight.block and weight.cols % BLOCK:
            raise ValueError(
                f"{self._what}: block-wise weights need the input size to be a "
                f"multiple of {BLOCK}, got {weight.cols}"
            )

    def _plan(self, weight: Fp8Weight) -> ops.LayerPlan:
        fmt = self.scheme.checkpoint
        plan = ops.LayerPlan(
            fmt.activations if fmt is not None else "group" if weight.block else "token"
        )
        settings = self.scheme.settings
        if (
            plan.activations != "none"
            and settings.matmul != "triton"
            and weight.data.is_cuda
            and ops.kernels_run(weight.data)
        ):
            from .scaled_mm import scaled_mm_serves

            reason = scaled_mm_serves(weight, self.dtype, settings.fast_accum)
            if reason is not None and settings.matmul == "scaled_mm":
                raise ValueError(
                    f"{self._what}: plugins.settings.tallow-quant-fp8.matmul is "
                    f"scaled_mm, but {reason}"
                )
            plan.scaled_mm = reason is None
        if settings.kernel == "tensor_core":
            from .tensor_core import to_packed

            plan.packed = to_packed(weight)
        return plan

    # -- compute ---------------------------------------------------------------------------
    def apply(
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.weight is None:
            return dense_linear(x, self.dense, bias)
        return ops.linear(x, self.weight, self.plan, bias, settings=self.scheme.settings)

    def apply_gated(
        self, layer: nn.Module, x: torch.Tensor, act: nn.Module, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        kind = getattr(act, "kind", None)
        if self.weight is None or kind is None:
            return self.apply(layer, act(x), bias)
        if kind not in self._warm_gates and x.is_cuda:
            # the kernels that apply the activation as they read x are variants of their own:
            # compiled at the first gated call (the engine runs every captured shape eagerly
            # before capturing it)
            self._warm_gates.add(kind)
            if not torch.cuda.is_current_stream_capturing():
                ops.warm_up(self.weight, self.plan, x.dtype, self.scheme.settings, gate=kind)
        return ops.linear(x, self.weight, self.plan, bias, settings=self.scheme.settings, gate=kind)

    def embedding(self, layer: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        if self.weight is None:
            return nn.functional.embedding(ids, self.dense)
        return ops.embedding(self.weight, ids, self.dtype)


def _slice_weight(w: Fp8Weight, r0: int, r1: int, c0: int, c1: int, what: str) -> Fp8Weight:
    """Rows ``r0:r1`` and columns ``c0:c1`` of ``w`` (block-wise: on block boundaries)."""
    if not w.block:
        return Fp8Weight(w.data[r0:r1, c0:c1], w.scale[r0:r1], "row", w.input_scale)
    if r0 % BLOCK or c0 % BLOCK:
        raise ValueError(
            f"{what}: rows {r0}:{r1} and columns {c0}:{c1} of a block-wise weight "
            f"must start on {BLOCK}-element block boundaries"
        )
    scale = w.scale[r0 // BLOCK : -(-r1 // BLOCK), c0 // BLOCK : -(-c1 // BLOCK)]
    return Fp8Weight(w.data[r0:r1, c0:c1], scale, "block", w.input_scale)


def _fp8_on(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """An e4m3 slice as a contiguous tensor on ``device``, moved as bytes (not every device's
    copy kernels take float8)."""
    return t.view(torch.uint8).to(device).contiguous().view(FP8)


def _pad(t: torch.Tensor, rows: int) -> torch.Tensor:
    if not rows:
        return t
    return torch.cat([t, t.new_zeros(rows, *t.shape[1:])])


def _pad_weight(w: Fp8Weight, rows: int) -> Fp8Weight:
    """``w`` with ``rows`` zero rows below (the vocabulary padding of the last shard)."""
    data = _pad(w.data.view(torch.uint8), rows).view(FP8)
    if w.block:
        extra = -(-(w.rows + rows) // BLOCK) - w.scale.shape[0]
        scale = _pad(w.scale, extra)
    else:
        scale = _pad(w.scale, rows)
    return Fp8Weight(data, scale, w.layout, w.input_scale)
