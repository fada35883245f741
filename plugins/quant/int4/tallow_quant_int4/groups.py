"""The scale and zero point of each group of weights, and the codes they give.

A group of ``g`` weights ``v`` becomes codes ``q`` in ``0 .. 2**bits - 1`` with
``v ≈ scale * (q - zero)``. Symmetric groups have the fixed zero ``2**(bits-1)`` and a scale
that covers ``[-2**(bits-1), 2**(bits-1) - 1]`` steps; asymmetric ones an integer zero point
and a scale that covers the group's own range ``[min(v, 0), max(v, 0)]``. Either range is
searched over a few clipping ratios (symmetric: of its magnitude; asymmetric: of each end), and
each group takes the one whose rounded weights have the least squared error: clipping the
rare largest weights buys a finer step for all the others.

Inside GPTQ, with ``clip_search``, the error of each candidate is weighted per column (by the
diagonal of the layer's Hessian, the energy of that column's input, or by what GPTQ's own cost
gives the column's error: :func:`tallow_quant_int4.gptq.clip_weights`), and the candidates
also include the finer grid
:data:`SHARED_CLIPS`, applied to both ends of an asymmetric range together (to the magnitude of
a symmetric one).

Scales are rounded to how they are stored (float16 where they fit, else float32) before the
codes are chosen, so the codes are the nearest for the stored scale.
"""

from __future__ import annotations

import itertools

import torch

#: fractions of the largest magnitude tried as a symmetric group's range
SYMMETRIC_CLIPS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75)
#: fractions of each end of an asymmetric group's range tried (every pair)
ASYMMETRIC_CLIPS = (1.0, 0.95, 0.9, 0.85, 0.8)
#: fractions of the range tried on top of the above by the Hessian-weighted search (both ends
#: of an asymmetric range shrunk by the same fraction)
SHARED_CLIPS = tuple(round(1.0 - 0.02 * k, 2) for k in range(11))
#: float16 keeps scales exactly in this range; outside it they are stored in float32
F16_RANGE = (2.0**-14, 65504.0)


def stored_scale(scale: torch.Tensor) -> torch.Tensor:
    """``scale`` rounded as it will be stored (float16 where it fits), in float32."""
    lo, hi = F16_RANGE
    fits = (scale >= lo) & (scale <= hi)
    return torch.where(fits, scale.to(torch.float16).to(torch.float32), scale)


def storage_dtype(scales: torch.Tensor) -> torch.dtype:
    """float16 when every nonzero scale fits it, else float32."""
    lo, hi = F16_RANGE
    nonzero = scales[scales > 0]
    if nonzero.numel() == 0 or (float(nonzero.min()) >= lo and float(nonzero.max()) <= hi):
        return torch.float16
    return torch.float32


def codes_for(v: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    """The nearest codes of ``v [..., g]`` for ``scale`` and ``zero`` ``[...]`` (float32);
    a zero scale gives the zero point."""
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))[..., None]
    top = (1 << bits) - 1
    return (torch.round(v / safe) + zero[..., None]).clamp(0, top)


def fit(
    v: torch.Tensor,
    bits: int,
    symmetric: bool,
    column_weights: torch.Tensor | None = None,
    clip: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(scale, zero)`` ``[...]`` (float32; the scale as stored, the zero an integer) of
    each group ``v [..., g]`` (float32): the clipping ratio with the least squared error.
    With ``column_weights`` (nonnegative, broadcastable to ``v``: inside GPTQ, the weights of
    the group's columns) each column's squared error is weighted by it, and the ratios of
    :data:`SHARED_CLIPS` are tried as well. Without ``clip`` every group takes its whole range
    (the ratio 1 only; ``column_weights`` then change nothing)."""
    half = 1 << (bits - 1)
    shared = SHARED_CLIPS if column_weights is not None and clip else ()
    if symmetric:
        base = torch.maximum(
            v.amax(-1).clamp(min=0) / (half - 1), (-v).amax(-1).clamp(min=0) / half
        )
        zero = torch.full_like(base, float(half))
        ratios = SYMMETRIC_CLIPS if clip else (1.0,)
        ratios += tuple(r for r in shared if r not in ratios)
        candidates = ((base * r, zero) for r in ratios)
    else:
        lo, hi = v.amin(-1).clamp(max=0), v.amax(-1).clamp(min=0)
        top = (1 << bits) - 1
        pairs = list(itertools.product(ASYMMETRIC_CLIPS if clip else (1.0,), repeat=2))
        pairs += [(r, r) for r in shared if (r, r) not in pairs]
        candidates = (_asymmetric(lo * a, hi * b, top) for a, b in pairs)
    best_scale = best_zero = best_err = None
    for scale, zero in candidates:
        scale = stored_scale(scale)
        q = codes_for(v, scale, zero, bits)
        err = ((q - zero[..., None]) * scale[..., None] - v).square()
        if column_weights is not None:
            err = err * column_weights
        err = err.sum(-1)
        if best_err is None:
            best_scale, best_zero, best_err = scale, zero, err
            continue
        better = err < best_err
        best_scale = torch.where(better, scale, best_scale)
        best_zero = torch.where(better, zero, best_zero)
        best_err = torch.where(better, err, best_err)
    return best_scale, best_zero


def _asymmetric(lo: torch.Tensor, hi: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The float scale of the range ``[lo, hi]`` and the integer zero that puts ``lo`` on a
    code (from the stored scale)."""
    scale = stored_scale((hi - lo) / top)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    return scale, torch.round(-lo / safe).clamp(0, top)
