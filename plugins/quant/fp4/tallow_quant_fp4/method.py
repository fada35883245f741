"""The LinearMethod of the ``fp4`` scheme: a layer's weight kept as e2m1 codes with their scale
bytes (:mod:`tallow_quant_fp4.layout`), on :class:`tallow.layers.PackedLinearMethod` (one
placeholder per checkpoint tensor name, unpacked when loading ends, neighbours stacked)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from tallow.kernels import packed_gemm, packed_gemm_warm_up
from tallow.layers import PackedLinearMethod, WeightSlice

from . import ops, tensor_core
from .checkpoint import unpack
from .layout import FP4Weight, from_codes

if TYPE_CHECKING:  # pragma: no cover
    from .scheme import FP4QuantScheme


class FP4LinearMethod(PackedLinearMethod):
    buffer_prefix = "fp4"

    def __init__(self, scheme: "FP4QuantScheme", prefix: str) -> None:
        layout = scheme.layout
        super().__init__(
            prefix,
            layout.tensors if layout else (),
            layout.required if layout else (),
            quantize_floats=bool(scheme.isq),
        )
        self.scheme = scheme
        self.layout = layout
        #: under ``kernel: tensor_core``, the parts re-laid for the packed GEMM, and the parts
        #: list they were made from
        self._packed: list[Any] = []
        self._packed_from: list[Any] | None = None

    def quantize_float(self, weight: torch.Tensor) -> FP4Weight | None:
        from .isq import quantize_mxfp4

        return quantize_mxfp4(weight, self.device)

    def unpack_shard(
        self,
        tensors: dict[str, torch.Tensor],
        shape: tuple[int, int],
        slices: list[WeightSlice],
        what: str,
    ) -> list[FP4Weight]:
        t = {name: v.to(self.device) for name, v in tensors.items()}
        codes, scales, global_scale = unpack(self.layout, t, shape, what)
        group = 32 if self.layout.kind == "mxfp4" else 16
        out = []
        for s in slices:
            (r0, r1), cols = s.rows, s.cols
            c0, c1 = cols if cols is not None else (0, shape[1])
            if c0 % 32 or c1 % 32:
                raise ValueError(
                    f"{what}: this rank's columns {c0}:{c1} do not fall on 32-column blocks"
                )
            out.append(
                from_codes(
                    self.layout.kind,
                    codes[r0:r1, c0:c1],
                    scales[r0:r1, c0 // group : c1 // group],
                    global_scale,
                )
            )
        return out

    gated_kinds = ops.ACTIVATIONS

    def matmul(
        self, x: torch.Tensor, bias: torch.Tensor | None = None, gate: str | None = None
    ) -> torch.Tensor:
        if self._tensor_core(x):
            return packed_gemm(ops.activated(x, gate) if gate else x, self._packed_parts(), bias)
        return ops.linear(x, self.parts, bias, gate=gate)

    def _tensor_core(self, x: torch.Tensor) -> bool:
        """Whether ``kernel: tensor_core`` sends this product through the packed GEMM."""
        return self.scheme.settings.kernel == "tensor_core" and tensor_core.applies(x, self.parts)

    def _packed_parts(self) -> list[Any]:
        """The parts in the packed GEMM's layout, re-laid once per list of parts."""
        if self._packed_from is not self.parts:
            self._packed = [tensor_core.to_packed(p) for p in self.parts]
            self._packed_from = self.parts
        return self._packed

    def warm_up(self, dtype: torch.dtype, gate: str | None = None) -> None:
        if self.parts and self._tensor_core(torch.empty(0, dtype=dtype, device=self.device)):
            packed_gemm_warm_up(self._packed_parts(), dtype)
            return
        ops.warm_up(self.parts, dtype, gate=gate)

    def type_names(self) -> list[str]:
        return [p.type_name if isinstance(p, FP4Weight) else "dense" for p in self.parts]
