"""Triton RMSNorm: one program per row, the whole row in registers."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import allow_next, pdl_enabled, wait_prior

# Rows wider than this would not fit one program's registers.
MAX_HIDDEN = 65536


@triton.jit
def _rms_norm_kernel(
    x_ptr,
    res_ptr,
    w_ptr,
    out_ptr,
    new_res_ptr,
    hidden,
    eps,
    HAS_RESIDUAL: tl.constexpr,
    GEMMA: tl.constexpr,
    BLOCK: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    if USE_PDL:
        # The norm weight is no kernel's output: read it while the previous kernel finishes.
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        wait_prior(USE_PDL)
        allow_next(USE_PDL)
    x = tl.load(x_ptr + row * hidden + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * hidden + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x_ptr.dtype.element_ty)
        tl.store(new_res_ptr + row * hidden + offs, x, mask=mask)
    xf = x.to(tl.float32)
    mean_sq = tl.sum(xf * xf, axis=0) / hidden
    normed = xf * tl.math.rsqrt(mean_sq + eps)
    if not USE_PDL:  # loaded here, as before PDL: no code change without it
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if GEMMA:
        out = normed * (1.0 + w)
    else:
        out = normed.to(x_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(out_ptr + row * hidden + offs, out.to(out_ptr.dtype.element_ty), mask=mask)


def rms_norm_triton(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    gemma_style: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Triton version of ``norm.rms_norm_ref`` (same contract; arguments already checked)."""
    hidden = x.shape[-1]
    if hidden > MAX_HIDDEN:
        raise ValueError(f"x: last dim {hidden} exceeds the kernel's {MAX_HIDDEN}")
    x2 = x.reshape(-1, hidden).contiguous()
    out = torch.empty_like(x2)
    res2 = residual.reshape(-1, hidden).contiguous() if residual is not None else x2
    new_res = torch.empty_like(x2) if residual is not None else out
    block = triton.next_power_of_2(hidden)
    use_pdl = pdl_enabled(x)
    _rms_norm_kernel[(x2.shape[0],)](
        x2,
        res2,
        weight.contiguous(),
        out,
        new_res,
        hidden,
        float(eps),
        HAS_RESIDUAL=residual is not None,
        GEMMA=bool(gemma_style),
        BLOCK=block,
        USE_PDL=use_pdl,
        num_warps=min(16, max(1, block // 256)),
        launch_pdl=use_pdl,
    )
    if residual is None:
        return out.view(x.shape)
    return out.view(x.shape), new_res.view(x.shape)
