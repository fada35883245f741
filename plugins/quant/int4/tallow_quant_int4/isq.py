"""Load-time quantization (``model.isq: int4``): float weights → 4-bit codes with a scale (and
a zero point, unless symmetric) per group of columns, on the device.

Two methods (the scheme's ``method`` setting), both deterministic:

- ``gptq`` (the default): the layers keep their float weights while the model loads; the
  engine then runs the model over calibration text, each layer accumulates ``sum(x x^T)`` of
  its inputs, and :func:`tallow_quant_int4.gptq.gptq` chooses the codes that keep the layer's
  outputs closest over those inputs. A layer that saw no input (an untied LM head) is rounded
  to nearest.
- ``rtn``: round to nearest as each tensor arrives, no calibration, the group's range clipped
  where that lowers its squared error (:func:`tallow_quant_int4.groups.fit`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .groups import codes_for, fit, storage_dtype
from .layout import IntWeight, from_codes

#: group sizes a row may fall back to, largest first, when the chosen one does not divide it
GROUP_SIZES = (128, 64, 32)
METHODS = ("gptq", "rtn")


@dataclass(frozen=True)
class Recipe:
    """How ``model.isq: int4`` chooses codes (the scheme's settings)."""

    method: str = "gptq"
    group: int = 128
    symmetric: bool = False
    act_order: bool = False
    bits: int = 4
    #: GPTQ's damping, a fraction of the mean of the Hessian's diagonal
    damp: float = 0.01
    #: GPTQ's group ranges clipped by the per-column weighted error (:func:`groups.fit`)
    clip_search: bool = False
    #: how the clip search weights each column's error: ``hessian`` or ``inverse``
    #: (:func:`tallow_quant_int4.gptq.clip_weights`)
    clip_weighting: str = "hessian"
    #: each group's range searched over clipping ratios (False: its whole range)
    clip: bool = True

    def group_for(self, cols: int) -> int | None:
        """The group size for rows of ``cols`` columns: the recipe's, else the largest smaller
        one of :data:`GROUP_SIZES` that divides them; None when none does (kept dense)."""
        sizes = (self.group, *(g for g in GROUP_SIZES if g < self.group))
        return next((g for g in sizes if cols % g == 0), None)

    @property
    def name(self) -> str:
        """``int4 g128 asym gptq``, for the log and benchmarks."""
        return " ".join(
            p
            for p in (
                f"int{self.bits}",
                f"g{self.group}",
                "sym" if self.symmetric else "asym",
                self.method,
                "act-order" if self.act_order else "",
                "" if self.clip else "no-clip",
                self._clip_name(),
            )
            if p
        )

    def _clip_name(self) -> str:
        if not self.clip_search:
            return ""
        return "clip-search" if self.clip_weighting == "hessian" else "clip-search-inverse"


@torch.no_grad()
def quantize_rtn(
    weight: torch.Tensor, device: torch.device, recipe: Recipe = Recipe(method="rtn")
) -> IntWeight | None:
    """``weight [rows, cols]`` (any float dtype and device) rounded to nearest on ``device``;
    None when no group size divides its rows."""
    rows, cols = _check(weight, recipe)
    group = recipe.group_for(cols)
    if group is None:
        return None
    w = weight.to(device, torch.float32).reshape(rows, cols // group, group)
    scale, zero = fit(w, recipe.bits, recipe.symmetric, clip=recipe.clip)
    codes = codes_for(w, scale, zero, recipe.bits).to(torch.uint8).reshape(rows, cols)
    return from_codes(
        codes,
        scale.to(storage_dtype(scale)),
        None if recipe.symmetric else zero.to(torch.uint8),
        recipe.bits,
    )


@torch.no_grad()
def quantize_calibrated(
    weight: torch.Tensor,
    hessian: torch.Tensor | None,
    device: torch.device,
    recipe: Recipe,
    cross: torch.Tensor | None = None,
) -> IntWeight | None:
    """``weight`` quantized with GPTQ against ``hessian`` (the sum of ``x x^T`` over its
    calibration inputs), or rounded to nearest when the layer saw none; None when no group
    size divides its rows. With ``cross`` (``sum x_f x^T``, ``x_f`` the float model's input
    where the quantized model's was ``x``) GPTQ aims at the float layer's outputs over the
    float inputs (:func:`tallow_quant_int4.gptq.float_target`)."""
    if hessian is None:
        return quantize_rtn(weight, device, recipe)
    from .gptq import float_target, gptq

    rows, cols = _check(weight, recipe)
    group = recipe.group_for(cols)
    if group is None:
        return None
    if cross is not None:
        weight = float_target(weight.to(device), hessian.to(device), cross.to(device), recipe.damp)
    return gptq(
        weight,
        hessian,
        bits=recipe.bits,
        group=group,
        symmetric=recipe.symmetric,
        act_order=recipe.act_order,
        damp=recipe.damp,
        clip_search=recipe.clip_search,
        clip_weighting=recipe.clip_weighting,
        clip=recipe.clip,
        device=device,
    )


def _check(weight: torch.Tensor, recipe: Recipe) -> tuple[int, int]:
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(
            f"model.isq int{recipe.bits}: expected a 2-d float weight, got "
            f"{weight.dtype} of shape {tuple(weight.shape)}"
        )
    return weight.shape[0], weight.shape[1]
