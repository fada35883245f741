"""The LinearMethod of the ``int4`` scheme: a layer's weight kept as integer codes in the
plugin's layout (:mod:`tallow_quant_int4.layout`).

The parameters, loading and stacking are :class:`tallow.layers.PackedLinearMethod`'s: one
placeholder per tensor name of the checkpoint's format (GPTQ: ``qweight``, ``qzeros``,
``scales``, ``g_idx``; compressed-tensors: ``weight_packed``, ...) plus ``weight`` for a layer
kept in floats. When loading ends each shard is unpacked (:mod:`tallow_quant_int4.formats`),
this rank's rows and columns are cut out and packed into the layout once (and, under the
setting ``kernel: tensor_core``, re-laid once more for :mod:`tallow_quant_int4.tensor_core`).
Float weights are quantized under ``model.isq`` (:mod:`tallow_quant_int4.isq`): as they load
(``rtn``), or held until the engine has run the model over calibration text, each layer adding
its inputs to a Hessian, and then quantized by GPTQ (``gptq``); else they are kept dense. Under the scheme's
``sequential`` setting the engine runs every calibration window in one forward pass and each
layer quantizes as soon as it has seen its inputs, before computing its output, so every later
layer's Hessian is gathered from the outputs of the quantized layers before it. With
``float_reference`` as well the pass holds every window twice, the first copies kept on the
float weights: each layer then aims at the float model's outputs, not just at its own float
weights' outputs over the quantized inputs (:func:`tallow_quant_int4.gptq.float_target`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from tallow.kernels import packed_gemm_warm_up
from tallow.layers import PackedLinearMethod, WeightSlice

from . import ops, tensor_core
from .formats import Unpacked, unpack_awq, unpack_compressed, unpack_gptq, unpack_marlin
from .layout import IntWeight, from_codes

if TYPE_CHECKING:  # pragma: no cover
    from .scheme import IntQuantScheme


class IntLinearMethod(PackedLinearMethod):
    """Integer weights of one layer (see the module docstring)."""

    buffer_prefix = "int"

    def __init__(self, scheme: "IntQuantScheme", prefix: str) -> None:
        layout = scheme.layout  # None under model.isq
        # GPTQ holds the float weights until the engine has calibrated
        at_load = bool(scheme.isq) and not scheme.calibrating
        super().__init__(
            prefix,
            layout.tensors if layout else (),
            layout.required if layout else (),
            quantize_floats=at_load,
        )
        self.scheme = scheme
        self.layout = layout
        #: sum of x x^T over the inputs seen while calibrating (float32 [cols, cols])
        self.hessian: torch.Tensor | None = None
        #: the held float weights have been quantized (no more inputs to observe)
        self.quantized = False
        #: sum of x_f x^T, x_f the float model's input where the quantized one's was x
        self.cross: torch.Tensor | None = None
        #: under ``kernel: tensor_core``, the parts re-laid for the packed GEMM, and the parts
        #: list they were made from
        self._packed: list[Any] = []
        self._packed_from: list[Any] | None = None

    def quantize_float(self, weight: torch.Tensor) -> IntWeight | None:
        from .isq import quantize_rtn

        return quantize_rtn(weight, self.device, self.scheme.recipe)

    def quantize_held_weights(self) -> None:
        """After calibration: every float part quantized against the layer's Hessian (parts
        no group size fits stay dense); once only."""
        from .isq import quantize_calibrated

        if self.quantized:
            return
        self.quantized = True
        parts = [
            p
            if not isinstance(p, torch.Tensor)
            else quantize_calibrated(p, self.hessian, self.device, self.scheme.recipe, self.cross)
            or p
            for p in self.parts
        ]
        self.hessian = self.cross = None
        self.replace_parts(parts)

    def _observe(
        self, x: torch.Tensor, gate: str | None, reference: torch.Tensor | None = None
    ) -> None:
        flat = self._flat_inputs(x, gate)
        if self.hessian is None:
            self.hessian = torch.zeros(
                flat.shape[1], flat.shape[1], dtype=torch.float32, device=flat.device
            )
        self.hessian.addmm_(flat.T, flat)
        if reference is not None:
            ref = self._flat_inputs(reference, gate)
            if self.cross is None:
                self.cross = torch.zeros_like(self.hessian)
            self.cross.addmm_(ref.T, flat)

    @staticmethod
    def _flat_inputs(x: torch.Tensor, gate: str | None) -> torch.Tensor:
        inputs = ops.activated(x, gate) if gate is not None else x
        return inputs.reshape(-1, inputs.shape[-1]).to(torch.float32)

    def _calibrate_beside_float(
        self, x: torch.Tensor, bias: torch.Tensor | None, gate: str | None
    ) -> torch.Tensor:
        """The pass of ``float_reference``: the first half of ``x``'s rows the float model's
        (answered by the float weights), the second the same tokens in the quantized model
        (answered by the weights this layer quantizes now)."""
        flat = x.reshape(-1, x.shape[-1])
        half = flat.shape[0] // 2
        reference, inputs = flat[:half], flat[half:]
        out_ref = ops.linear(reference, self.parts, bias, policy=self.scheme.policy, gate=gate)
        self._observe(inputs, gate, reference)
        self.quantize_held_weights()
        out = ops.linear(inputs, self.parts, bias, policy=self.scheme.policy, gate=gate)
        return torch.cat([out_ref, out]).view(*x.shape[:-1], out.shape[-1])

    def unpack_shard(
        self,
        tensors: dict[str, torch.Tensor],
        shape: tuple[int, int],
        slices: list[WeightSlice],
        what: str,
    ) -> list[IntWeight]:
        unpacked = _unpack(self.layout, tensors, shape, self.device, what)
        if unpacked.group_index is not None and any(
            s.cols is not None and s.cols != (0, shape[1]) for s in slices
        ):
            raise ValueError(
                f"{what}: act-order (g_idx) weights cannot be split along their "
                "input features across tensor-parallel ranks"
            )
        return [_slice(unpacked, s, what) for s in slices]

    # -- compute ---------------------------------------------------------------------------
    gated_kinds = ops.ACTIVATIONS

    def matmul(
        self, x: torch.Tensor, bias: torch.Tensor | None = None, gate: str | None = None
    ) -> torch.Tensor:
        if self.scheme.calibrating and not self.quantized:
            if self.scheme.settings.float_reference:
                return self._calibrate_beside_float(x, bias, gate)
            self._observe(x, gate)
            if self.scheme.settings.sequential:  # x holds every calibration window
                self.quantize_held_weights()
        if self.scheme.policy.tensor_core and tensor_core.applies(x, self.parts):
            if gate is not None:
                x = ops.activated(x, gate)
            lead = x.shape[:-1]
            y = tensor_core.linear(
                x.reshape(-1, x.shape[-1]), self.parts, self._packed_parts(), bias
            )
            return y.view(*lead, y.shape[-1])
        return ops.linear(x, self.parts, bias, policy=self.scheme.policy, gate=gate)

    def _packed_parts(self) -> list[Any]:
        """The parts in the packed GEMM's layout, re-laid once per list of parts."""
        if self._packed_from is not self.parts:
            self._packed = [tensor_core.to_packed(p) for p in self.parts]
            self._packed_from = self.parts
        return self._packed

    def warm_up(self, dtype: torch.dtype, gate: str | None = None) -> None:
        if (
            self.scheme.policy.tensor_core
            and self.parts
            and all(isinstance(p, IntWeight) for p in self.parts)
        ):
            packed_gemm_warm_up(self._packed_parts(), dtype)
            return
        ops.warm_up(self.parts, dtype, self.scheme.policy, gate=gate)

    def type_names(self) -> list[str]:
        """What each part holds, for the scheme's summary."""
        return [p.type_name if isinstance(p, IntWeight) else "dense" for p in self.parts]


def _unpack(
    layout: Any,
    tensors: dict[str, torch.Tensor],
    shape: tuple[int, int],
    device: torch.device,
    what: str,
) -> Unpacked:
    t = {name: v.to(device) for name, v in tensors.items()}
    if layout.kind == "gptq":
        return unpack_gptq(
            t["qweight"],
            t["qzeros"],
            t["scales"],
            t.get("g_idx"),
            shape,
            zero_offset=layout.zero_offset,
            what=what,
        )
    if layout.kind == "awq":
        return unpack_awq(t["qweight"], t["qzeros"], t["scales"], shape, what=what)
    if layout.kind == "marlin":
        return unpack_marlin(t["B"], t["s"], shape, what=what)
    stated = t.get("weight_shape")
    if stated is not None and tuple(int(v) for v in stated.tolist()) != shape:
        raise ValueError(
            f"{what}: weight_shape says {stated.tolist()}, the layer expects {list(shape)}"
        )
    return unpack_compressed(
        t["weight_packed"],
        t["weight_scale"],
        t.get("weight_zero_point"),
        t.get("weight_g_idx"),
        shape,
        what=what,
    )


def _slice(u: Unpacked, part: WeightSlice, what: str) -> IntWeight:
    """This rank's rows and columns of an unpacked checkpoint weight, in the layout."""
    (r0, r1), cols = part.rows, part.cols
    k = u.codes.shape[1]
    c0, c1 = cols if cols is not None else (0, k)
    groups = u.scales.shape[1]
    group = k // groups
    if (c0, c1) != (0, k) and (c0 % group or c1 % group):
        raise ValueError(
            f"{what}: this rank's columns {c0}:{c1} do not fall on the "
            f"{group}-column groups of the weight"
        )
    g0, g1 = (0, groups) if u.group_index is not None else (c0 // group, c1 // group)
    zeros = None if u.zeros is None else u.zeros[r0:r1, g0:g1]
    return from_codes(
        u.codes[r0:r1, c0:c1],
        u.scales[r0:r1, g0:g1],
        zeros,
        u.bits,
        group_index=u.group_index,
        what=what,
    )
