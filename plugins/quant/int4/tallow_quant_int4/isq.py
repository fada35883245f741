"""In-situ quantization (``model.isq: int4``): float weights → 4-bit symmetric codes with one
float16 scale per group of 128 columns, on the device, as each tensor loads.

Round to nearest, with the scale of each group chosen among a few clipping ratios of the
largest magnitude as the one whose rounded weights are closest to the group's (least squared
error): no calibration data, deterministic, a few passes over each weight. Codes are ``-8..7``
stored plus 8; the scale is rounded to float16 before the codes are computed, so the codes
are the nearest ones for the scale that is stored.
"""

from __future__ import annotations

import torch

from .layout import IntWeight, from_codes

#: group sizes tried in order: the first that divides a row is used
GROUP_SIZES = (128, 64, 32)
#: fractions of the largest magnitude tried as the top of each group's range
CLIP_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)
#: float16 keeps scales exactly in this range; outside it the scales are stored in float32
_F16_RANGE = (2.0**-14, 65504.0)


def group_size_for(cols: int) -> int | None:
    """The group size for rows of ``cols`` columns, or None when none fits (kept dense)."""
    return next((g for g in GROUP_SIZES if cols % g == 0), None)


@torch.no_grad()
def quantize_rtn(weight: torch.Tensor, device: torch.device, bits: int = 4) -> IntWeight | None:
    """``weight [rows, cols]`` (any float dtype and device) quantized on ``device``; None when
    no group size divides its rows."""
    if weight.dim() != 2 or not weight.is_floating_point():
        raise ValueError(f"model.isq int{bits}: expected a 2-d float weight, got "
                         f"{weight.dtype} of shape {tuple(weight.shape)}")
    rows, cols = weight.shape
    group = group_size_for(cols)
    if group is None:
        return None
    half = 1 << (bits - 1)
    w = weight.to(device, torch.float32).reshape(rows, cols // group, group)
    top = w.amax(dim=-1).clamp(min=0)
    bottom = (-w).amax(dim=-1).clamp(min=0)
    base = torch.maximum(top / (half - 1), bottom / half)
    best_scale = best_err = None
    for ratio in CLIP_RATIOS:
        scale = _stored_scale(base * ratio)
        q = _codes(w, scale, half)
        err = ((q.to(torch.float32) - half) * scale[..., None] - w).square().sum(-1)
        if best_err is None:
            best_scale, best_err = scale, err
        else:
            better = err < best_err
            best_scale = torch.where(better, scale, best_scale)
            best_err = torch.where(better, err, best_err)
    codes = _codes(w, best_scale, half).reshape(rows, cols)
    scales = best_scale
    lo, hi = _F16_RANGE
    nonzero = scales[scales > 0]
    if nonzero.numel() and (float(nonzero.min()) >= lo and float(nonzero.max()) <= hi):
        scales = scales.to(torch.float16)
    return from_codes(codes, scales, None, bits)


def _stored_scale(scale: torch.Tensor) -> torch.Tensor:
    """The scale as it will be stored (float16 where it fits, float32 otherwise), in float32."""
    lo, hi = _F16_RANGE
    fits = (scale >= lo) & (scale <= hi)
    return torch.where(fits, scale.to(torch.float16).to(torch.float32), scale)


def _codes(w: torch.Tensor, scale: torch.Tensor, half: int) -> torch.Tensor:
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))[..., None]
    return (torch.round(w / safe).clamp(-half, half - 1) + half).to(torch.uint8)
