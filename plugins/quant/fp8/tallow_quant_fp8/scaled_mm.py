"""``torch._scaled_mm`` (cuBLAS's float8 GEMM) for the W8A8 path, and the check at load that it
takes a layer.

Layouts cuBLAS wants on Hopper: the e4m3 activations row-major ``[M, K]``, the weight
column-major (``q.t()`` of the row-major ``[N, K]`` weight). Scales:

- per-row weights: ``scale_a [M, 1]`` (per token), ``scale_b [1, N]``, both contiguous (the
  "row-wise" scaling, cuBLAS 12.9+ or CUTLASS inside torch);
- block-wise weights: ``scale_a [M, K/128]`` with strides ``(1, M)`` (1 x 128 blocks,
  "outer-dim-major"), ``scale_b`` the ``[N/128, K/128]`` block scales transposed (128 x 128
  blocks), which torch supports on Hopper with cuBLAS 12.9+; cuBLAS wants M a multiple of 4
  there, so the activations are padded (:func:`row_multiple`) and the extra rows dropped.

cuBLAS refuses some shapes (K and N must be multiples of 16; block scales have alignment rules
of their own), and an older torch has no block-wise scaling at all. :func:`scaled_mm_serves`
runs one small product per layer shape at load and compares it with the reference; a layer it
refuses takes the Triton GEMM.
"""

from __future__ import annotations

import logging

import torch

from . import reference
from .weights import BLOCK, Fp8Weight

log = logging.getLogger("tallow.quant.fp8")

#: rows of the products tried at load: cuBLAS's rules on the scales' layout may depend on
#: the row count (the 1 x 128 scales' leading dimension is M)
_PROBE_ROWS = (17, 18, 31, 32, 33, 100, 1000)


def row_multiple(weight: Fp8Weight) -> int:
    """The row count ``torch._scaled_mm``'s activations must be a multiple of for ``weight``."""
    return 4 if weight.block else 1


def scaled_mm(
    q: torch.Tensor,
    scales: torch.Tensor,
    weight: Fp8Weight,
    bias: torch.Tensor | None,
    out_dtype: torch.dtype,
    fast_accum: bool = False,
) -> torch.Tensor:
    """``(q * scales) @ (weight.data * weight.scale).T (+ bias)`` → ``[M, N]`` of
    ``out_dtype``, ``scales`` laid out as the module docstring says."""
    fuse_bias = (
        bias is not None
        and bias.dtype == out_dtype
        and out_dtype in (torch.bfloat16, torch.float16)
        and not weight.block
    )
    if weight.block:
        scale_b = weight.scale.t()
    else:
        scale_b = weight.scale.view(1, -1)
    y = torch._scaled_mm(
        q,
        weight.data.t(),
        scale_a=scales,
        scale_b=scale_b,
        bias=bias if fuse_bias else None,
        out_dtype=out_dtype,
        use_fast_accum=fast_accum,
    )
    if bias is not None and not fuse_bias:
        y = y + bias.to(out_dtype)
    return y


def scaled_mm_serves(weight: Fp8Weight, dtype: torch.dtype, fast_accum: bool = False) -> str | None:
    """None when ``torch._scaled_mm`` computes this weight's products on its device (within
    float8 accumulation error of the reference, on a few rows of activations); else why not.
    Checked once per shape, layout and dtype, with the first weight of that shape."""
    key = (weight.rows, weight.cols, weight.layout, dtype, weight.data.device, fast_accum)
    if key not in _VERDICTS:
        _VERDICTS[key] = _check(weight, dtype, fast_accum)
    return _VERDICTS[key]


_VERDICTS: dict[tuple, str | None] = {}
#: output rows compared with the reference (it dequantizes them)
_CHECKED_ROWS = 256


def _check(weight: Fp8Weight, dtype: torch.dtype, fast_accum: bool) -> str | None:
    from .kernels.quantize import quantize_activations_triton

    device = weight.data.device
    n, k = weight.rows, weight.cols
    what = f"[{n}, {k}] with {weight.layout} scales"
    if device.type != "cuda":
        return f"{device} is not a CUDA device"
    gen = torch.Generator(device=device).manual_seed(0)
    group = BLOCK if weight.block else None
    try:
        for m in _PROBE_ROWS:
            x = torch.randn(m, k, generator=gen, device=device).to(dtype)
            q, s = quantize_activations_triton(
                x, group=group, scales_column_major=weight.block, row_multiple=row_multiple(weight)
            )
            got = scaled_mm(q, s, weight, None, dtype, fast_accum)[:m].float()
        torch.cuda.synchronize(device)
    except Exception as exc:  # cuBLAS or torch refusing the shape or the scaling
        reason = f"torch._scaled_mm refused {what}: {exc}".splitlines()[0]
        log.info("%s; the Triton GEMM serves it", reason)
        return reason
    rows = min(n, _CHECKED_ROWS)
    part = Fp8Weight(
        weight.data[:rows],
        weight.scale[: -(-rows // BLOCK)] if weight.block else weight.scale[:rows],
        weight.layout,
    )
    expected = reference.linear_ref(x.float(), part, activations="group" if group else "token")
    err = ((got[:, :rows] - expected).abs().max() / expected.abs().max().clamp(min=1e-6)).item()
    if not err < 2e-2:
        reason = f"torch._scaled_mm gave a relative error of {err:.3g} on {what}"
        log.warning("%s; the Triton GEMM serves it", reason)
        return reason
    return None
