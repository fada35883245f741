"""Load-time quantization to MXFP4 (``model.isq: mxfp4``): per 32 columns a power-of-two
scale (an e8m0 byte) and e2m1 codes, as the OCP Microscaling format defines them.

The scale is ``2 ** (floor(log2(max |w|)) - 2)`` (2 is the exponent of e2m1's largest value,
6), and each weight divided by it is rounded to the nearest e2m1 value (an exact tie to the
smaller magnitude), saturating at 6.
"""

from __future__ import annotations

import torch

from .layout import E2M1_VALUES, FP4Weight, from_codes


@torch.no_grad()
def quantize_mxfp4(weight: torch.Tensor, device: torch.device) -> FP4Weight | None:
    """``weight [rows, cols]`` quantized on ``device``; None when 32 does not divide its
    rows."""
    rows, cols = weight.shape
    if cols % 32:
        return None
    codes, scales = mxfp4_codes(weight.to(device))
    return from_codes("mxfp4", codes, scales)


@torch.no_grad()
def mxfp4_codes(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e2m1 codes uint8 ``[..., cols]``, e8m0 scale bytes ``[..., cols / 32]``) of float
    ``weight [..., cols]`` (cols a multiple of 32), on its device."""
    *lead, cols = weight.shape
    if cols % 32:
        raise ValueError(f"MXFP4: rows of {cols} columns are not whole 32-column blocks")
    device = weight.device
    w = weight.to(torch.float32).reshape(-1, cols // 32, 32)
    top = w.abs().amax(dim=-1)
    exp = torch.where(top > 0, torch.floor(torch.log2(top)) - 2, torch.full_like(top, -127))
    exp = exp.clamp(-127, 127)
    scaled = (w / torch.exp2(exp)[..., None]).clamp(-6.0, 6.0)
    grid = torch.tensor(E2M1_VALUES[:8], device=device)
    distance = (scaled.abs()[..., None] - grid).abs()  # [rows, blocks, 32, 8]
    mag = distance.argmin(dim=-1).to(torch.uint8)
    codes = mag | ((scaled < 0) & (mag > 0)).to(torch.uint8) << 3
    scales = (exp + 127).to(torch.uint8)
    return codes.reshape(*lead, cols), scales.reshape(*lead, cols // 32)
