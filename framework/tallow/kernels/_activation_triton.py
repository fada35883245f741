"""Triton gated activations: a 2-D grid over (token, column block)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .pdl import allow_next, pdl_enabled, wait_prior

_BLOCK = 1024
#: the activations by name, as the kernels number them (KIND)
KINDS = {"silu": 0, "gelu_tanh": 1}


@triton.jit
def gated_value(g, u, KIND: tl.constexpr, OUT_TY: tl.constexpr):
    """``act(g) * u`` as the gated-activation kernels compute it (KIND 0 silu, 1 gelu_tanh):
    the activation in float32 rounded to ``OUT_TY``, times ``u``, rounded again. Shared with
    the GEMV that applies it to its input, so both give the same bits."""
    g = g.to(tl.float32)
    if KIND == 0:
        act = g / (1.0 + tl.exp(-g))
    else:
        # tanh(z) = 1 - 2 / (exp(2z) + 1): exact limits at both ends, no overflow to nan.
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        act = 0.5 * g * (2.0 - 2.0 / (tl.exp(2.0 * z) + 1.0))
    act = act.to(OUT_TY).to(tl.float32)
    return (act * u.to(tl.float32)).to(OUT_TY)


@triton.jit
def load_activations(ptrs, mask, K, GATE: tl.constexpr, X_TY: tl.constexpr):
    """Activations at ``ptrs`` in float32 (zero outside ``mask``), for a kernel that reads its
    input itself; with a gate (``GATE`` >= 0) the row is ``[gate | up]`` (``up`` K elements
    further) and the value ``act(gate) * up`` as the activation kernel rounds it (``X_TY`` the
    input's type)."""
    x = tl.load(ptrs, mask=mask, other=0.0)
    if GATE >= 0:
        x = gated_value(x, tl.load(ptrs + K, mask=mask, other=0.0), GATE, X_TY)
    return x.to(tl.float32)


@triton.jit
def _gated_act_kernel(
    x_ptr, out_ptr, x_stride, d, KIND: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr
):
    wait_prior(USE_PDL)  # everything below reads or writes this step's tensors
    allow_next(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    g = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    u = tl.load(x_ptr + row * x_stride + d + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * d + cols, gated_value(g, u, KIND, out_ptr.dtype.element_ty), mask=mask)


def gated_act_triton(x: torch.Tensor, kind: str) -> torch.Tensor:
    """``act(x[..., :d]) * x[..., d:]`` with act "silu" or "gelu_tanh" (shape already checked)."""
    d = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * d)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape[0], d, dtype=x.dtype, device=x.device)
    block = min(_BLOCK, triton.next_power_of_2(d))
    use_pdl = pdl_enabled(x)
    _gated_act_kernel[(x2.shape[0], triton.cdiv(d, block))](
        x2, out, x2.stride(0), d, KIND=KINDS[kind], BLOCK=block, USE_PDL=use_pdl, launch_pdl=use_pdl
    )
    return out.view(*x.shape[:-1], d)
