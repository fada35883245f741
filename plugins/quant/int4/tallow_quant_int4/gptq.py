"""GPTQ: integer codes chosen column by column so that the layer's outputs, over the inputs it
saw while calibrating, stay close to the float layer's (Frantar et al., 2022, "GPTQ: Accurate
Post-Training Quantization for Generative Pre-trained Transformers", arXiv:2210.17323).

With ``H = sum(x x^T)`` over the calibration inputs ``x`` of a layer, the output error of a
weight change ``D`` is ``tr(D H D^T)``. GPTQ rounds one input column at a time and spreads its
rounding error over the columns not yet rounded, weighted by the inverse of ``H`` (through the
upper Cholesky factor ``U`` of ``H^-1``: column ``i``'s error divided by ``U[i, i]`` times row
``i`` of ``U``), so later columns compensate for earlier ones. Columns are taken in blocks of
:data:`BLOCK`, the updates beyond a block applied once per block. Each group's scale and zero
point are fitted (:func:`tallow_quant_int4.groups.fit`) when its first column comes, on the
group's weights as updated so far. With ``act_order`` the columns are taken in decreasing
order of ``H``'s diagonal (the inputs with the most energy first, while the most columns are
left to absorb their error); the groups stay runs of consecutive columns, their scales and
zero points fitted on the original weights before any column moves ("static groups"), so the
layout needs no permutation and the matmul reads its input as it is.

With ``clip_search`` each group's clipping ratio is chosen by the squared error of its weights
weighted per column instead of the plain squared error, over a finer grid of ratios
(:func:`tallow_quant_int4.groups.fit`); the weight of a column is ``H``'s diagonal (the input
energy of the column; ``clip_weighting: hessian``) or the cost GPTQ pays for its error,
``1 / [H^-1]_ii`` over the columns not yet rounded (``clip_weighting: inverse``; see
:func:`clip_weights`).

Without ``clip`` each group's scale and zero point cover its whole range, as GPTQ's reference
implementation fits them (no clipping ratio searched).

A small multiple of the diagonal's mean (``damp``) is added to ``H`` so that it can be
inverted; input features that never fired (a zero diagonal) get weight zero.
"""

from __future__ import annotations

from typing import Iterator

import torch

from .groups import fit, storage_dtype
from .layout import IntWeight, from_codes

#: columns whose updates are applied together
BLOCK = 128
#: how ``clip_search`` weights each column's error (:func:`clip_weights`)
CLIP_WEIGHTINGS = ("hessian", "inverse")
#: how many times the damping may grow tenfold when H is still not positive definite
_DAMP_RETRIES = 4


@torch.no_grad()
def gptq(
    weight: torch.Tensor,
    hessian: torch.Tensor,
    *,
    bits: int,
    group: int,
    symmetric: bool,
    act_order: bool = False,
    damp: float = 0.01,
    clip_search: bool = False,
    clip_weighting: str = "hessian",
    clip: bool = True,
    device: torch.device | None = None,
) -> IntWeight:
    """``weight [rows, cols]`` quantized against ``hessian [cols, cols]`` (the sum of ``x
    x^T`` over the layer's calibration inputs), ``group`` dividing ``cols``; computed on
    ``device`` (default: the weight's) in float32. ``clip_weighting`` (with ``clip_search``):
    ``"hessian"`` or ``"inverse"`` (:func:`clip_weights`). Without ``clip`` every group
    takes its whole range (no clipping ratio searched)."""
    if clip_search and not clip:
        raise ValueError("GPTQ: clip_search needs clip (it searches clipping ratios)")
    if clip_weighting not in CLIP_WEIGHTINGS:
        raise ValueError(
            f"GPTQ: clip_weighting {clip_weighting!r} is not one of {', '.join(CLIP_WEIGHTINGS)}"
        )
    device = device or weight.device
    w = weight.to(device, torch.float32).clone()
    rows, cols = w.shape
    if cols % group or BLOCK % group:
        raise ValueError(f"GPTQ: group size {group} must divide the {cols} columns and {BLOCK}")
    h = hessian.to(device, torch.float32).clone()
    dead = torch.diagonal(h) == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    groups = torch.arange(cols, device=device) // group  # of each column, in natural order
    order = None
    if act_order:
        order = torch.argsort(torch.diagonal(h), descending=True, stable=True)
    u = _inverse_factor(h if order is None else h[order][:, order], damp)
    # each column's error weight when its group's range is chosen, in natural column order
    energy = clip_weights(h, u, order, clip_weighting) if clip_search else None
    if act_order:  # static groups: every group fitted before any column moves
        scales, zeros = fit(
            w.reshape(rows, -1, group),
            bits,
            symmetric,
            None if energy is None else energy.reshape(-1, group),
            clip,
        )
        w, h, groups = w[:, order], h[order][:, order], groups[order]
    else:
        scales = torch.empty(rows, cols // group, dtype=torch.float32, device=device)
        zeros = torch.empty_like(scales)
    codes = torch.empty(rows, cols, dtype=torch.uint8, device=device)
    top = float((1 << bits) - 1)
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))  # as codes_for
    for b0 in range(0, cols, BLOCK):
        b1 = min(b0 + BLOCK, cols)
        block = w[:, b0:b1].clone()
        errors = torch.empty_like(block)
        ub = u[b0:b1, b0:b1]
        for i in range(b1 - b0):
            col = b0 + i
            g = int(groups[col]) if order is not None else col // group
            if order is None and col % group == 0:
                # the group's columns as updated so far (groups never straddle blocks)
                scales[:, g], zeros[:, g] = fit(
                    block[:, i : i + group],
                    bits,
                    symmetric,
                    None if energy is None else energy[col : col + group],
                    clip,
                )
                safe[:, g] = torch.where(scales[:, g] > 0, scales[:, g], 1.0)
            x = block[:, i]
            q = torch.round(x / safe[:, g]).add_(zeros[:, g]).clamp_(0.0, top)
            codes[:, col] = q
            err = x.sub((q - zeros[:, g]) * scales[:, g]).div_(ub[i, i])
            block[:, i:].addr_(err, ub[i, i:], alpha=-1.0)
            errors[:, i] = err
        w[:, b1:] -= errors @ u[b0:b1, b1:]
    if order is not None:
        natural = torch.empty_like(codes)
        natural[:, order] = codes
        codes = natural
    return from_codes(
        codes,
        scales.to(storage_dtype(scales)),
        None if symmetric else zeros.to(torch.uint8),
        bits,
        what=f"GPTQ weight [{rows}, {cols}]",
    )


def clip_weights(
    h: torch.Tensor, u: torch.Tensor, order: torch.Tensor | None, weighting: str
) -> torch.Tensor:
    """The weight of each column's squared error (natural column order) when a group's
    clipping ratio is chosen: ``"hessian"``, ``H``'s diagonal (the column's input energy, as if
    no other column made up for its error); ``"inverse"``, ``1 / U[i, i]^2`` with ``U`` the
    upper Cholesky factor of the damped ``H^-1`` in GPTQ's column order (``u``; ``order`` the
    act-order permutation, None for the natural order): what a rounding error in column ``i``
    still costs the output after the columns not yet rounded have compensated for it, the
    cost GPTQ itself pays (``U[i, i]^2`` is the first diagonal entry of the inverse of ``H``
    restricted to column ``i`` and the columns after it)."""
    if weighting == "hessian":
        return torch.diagonal(h).clone()
    cost = torch.diagonal(u).square().reciprocal()
    if order is None:
        return cost
    natural = torch.empty_like(cost)
    natural[order] = cost
    return natural


@torch.no_grad()
def float_target(
    weight: torch.Tensor, hessian: torch.Tensor, cross: torch.Tensor, damp: float = 0.01
) -> torch.Tensor:
    """The weight ``V = W M H^-1`` whose outputs over the quantized model's inputs ``X_q``
    come closest (least squares) to the float layer's outputs over the float model's inputs
    ``X_f``: ``H = sum x_q x_q^T`` (``hessian``), ``M = sum x_f x_q^T`` (``cross``), rows of
    ``W`` the float layer's. Since ``X_f W^T - X_q V^T`` is then orthogonal to every ``X_q``
    direction, GPTQ of ``V`` against ``H`` minimises ``|X_f W^T - X_q Q^T|``: each layer also
    corrects the error the quantized layers before it left in its inputs (the asymmetric
    calibration of GPTAQ, Li et al., 2025, arXiv:2504.02692). Computed as ``W + W (M - H)
    (H + damping I)^-1``, so that where the inputs agree (``M = H``, the first layer) the
    damping leaves ``W`` exactly as it is. Float32, on the hessian's device; the damping as
    :func:`gptq`'s."""
    h = hessian.to(torch.float32)
    w = weight.to(h.device, torch.float32)
    dead = torch.diagonal(h) == 0
    h = h.clone()
    h[dead, dead] = 1.0
    drift = cross.to(h) - hessian.to(h)
    for factor in _damped_factors(h, damp):
        # V^T = W^T + (H + dI)^-1 (W (M - H))^T, H symmetric
        return w + torch.cholesky_solve((w @ drift).T, factor).T
    raise _singular(damp)


def _inverse_factor(h: torch.Tensor, damp: float) -> torch.Tensor:
    """The upper Cholesky factor of ``(h + damping * I)^-1``, the damping ``damp`` times the
    mean of the diagonal (grown tenfold while ``h`` is not yet positive definite)."""
    for factor in _damped_factors(h, damp):
        inverse = torch.cholesky_inverse(factor)
        upper, info = torch.linalg.cholesky_ex(inverse, upper=True)
        if int(info) == 0:
            return upper
    raise _singular(damp)


def _damped_factors(h: torch.Tensor, damp: float) -> Iterator[torch.Tensor]:
    """The lower Cholesky factors of ``h + damping * I``, the damping ``damp`` times the mean
    of the diagonal and growing tenfold on each try, for the tries where it factors."""
    mean = float(torch.diagonal(h).mean())
    eye = torch.eye(h.shape[0], dtype=h.dtype, device=h.device)
    for attempt in range(_DAMP_RETRIES + 1):
        factor, info = torch.linalg.cholesky_ex(h + (damp * 10**attempt) * mean * eye)
        if int(info) == 0:
            yield factor


def _singular(damp: float) -> ValueError:
    return ValueError(
        f"GPTQ: the calibration Hessian stays singular with damping up to "
        f"{damp * 10**_DAMP_RETRIES} (the layer's inputs are degenerate)"
    )
