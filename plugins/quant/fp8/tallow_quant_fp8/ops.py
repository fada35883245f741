"""Entry points of the fp8 matmul: which kernel a product takes.

By the rows ``M`` of the input (the same rule on every device, so the CPU reference computes
what a GPU computes):

- ``M <= gemv_max_rows`` (decode batches): weight-only, ``x @ (q * s).T`` with x unquantized:
  the Triton GEMV (:mod:`.kernels.gemv`);
- more rows: the activations are quantized to e4m3 (per token, per token and 128 columns for
  block-wise weights, or with the checkpoint's static scale; :mod:`.kernels.quantize`, which
  also applies a gated MLP's activation as it reads its input) and multiplied on the float8
  tensor cores by ``torch._scaled_mm`` (cuBLAS, per-row or 1 x 128 / 128 x 128 block scales)
  or by the Triton GEMM (:mod:`.kernels.gemm`) where cuBLAS does not take the layer.
  Weights-only checkpoints take the Triton GEMM on their unquantized activations.

Under the setting ``kernel: tensor_core`` the weight-only products of 16-bit activations run
tallow's packed-weight tensor-core GEMM instead (:mod:`.tensor_core`).

The Triton paths run on CUDA GPUs of compute capability 8.9 or newer (float8 conversions and
tensor cores) and, under ``TRITON_INTERPRET=1``, on CPU tensors; anything else runs the torch
reference (:mod:`.reference`), which dequantizes the weight on every call. Nothing here
synchronises with the device, and each call of one shape allocates alike, so CUDA graphs
capture it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from tallow.kernels import (
    PackedGemmWeight,
    interpreting,
    packed_gemm,
    packed_gemm_warm_up,
    triton_enabled,
)

from . import reference
from .settings import Fp8Settings
from .weights import BLOCK, Fp8Weight

#: the compute capability of the float8 kernels (float8 conversions and tensor cores)
FP8_CAPABILITY = (8, 9)
_ACTIVATIONS = ("silu", "gelu_tanh")


@dataclass
class LayerPlan:
    """What a layer's products need besides its weight: how its activations are quantized in
    the W8A8 path (``token``, ``group``, ``static`` or ``none`` for weights only) and whether
    ``torch._scaled_mm`` takes it on this device. Where the kernels do not run, the reference
    keeps the dequantized weight (``dequantized``, made at the first product: float32 on a
    CPU, the activations' dtype on a GPU without float8): a CPU converts e4m3 at ~50 M values/s,
    too slow to repeat for every product."""

    activations: str
    scaled_mm: bool = False
    dequantized: torch.Tensor | None = field(default=None, repr=False)
    #: under ``kernel: tensor_core``, the weight re-laid for the packed GEMM, which then
    #: takes the weight-only products of 16-bit activations
    packed: PackedGemmWeight | None = field(default=None, repr=False)


@functools.lru_cache(maxsize=None)
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def device_capability(device: torch.device) -> tuple[int, int] | None:
    """(major, minor) of a CUDA device, None for others."""
    if device.type != "cuda":
        return None
    return _capability(device.index if device.index is not None else torch.cuda.current_device())


def kernels_run(x: torch.Tensor) -> bool:
    """Whether the Triton kernels serve tensors like ``x``: a CUDA device of compute capability
    8.9+, or any tensor in Triton's interpreter."""
    if not triton_enabled(x):
        return False
    if interpreting() and x.device.type == "cpu":
        return True
    cap = device_capability(x.device)
    return cap is not None and cap >= FP8_CAPABILITY


def _act(x: torch.Tensor, kind: str) -> torch.Tensor:
    from tallow.kernels import gelu_tanh_and_mul, silu_and_mul

    return silu_and_mul(x) if kind == "silu" else gelu_tanh_and_mul(x)


def linear(
    x: torch.Tensor,
    weight: Fp8Weight,
    plan: LayerPlan,
    bias: torch.Tensor | None = None,
    *,
    settings: Fp8Settings,
    gate: str | None = None,
) -> torch.Tensor:
    """``x [..., K] @ (q * s).T (+ bias)`` → ``[..., N]`` in x's dtype (see the module
    docstring). With ``gate`` (``"silu"`` or ``"gelu_tanh"``) x is ``[..., 2K]``,
    ``[gate | up]``, and the product is ``(act(gate) * up) @ W.T``."""
    if gate is not None and gate not in _ACTIVATIONS:
        raise ValueError(f"gate must be one of {', '.join(_ACTIVATIONS)}, got {gate!r}")
    width = weight.cols * (2 if gate is not None else 1)
    if x.shape[-1] != width:
        raise ValueError(
            f"fp8 linear: x has {x.shape[-1]} input features, expected {width}"
            + (" ([gate | up])" if gate is not None else "")
        )
    lead = x.shape[:-1]
    x2 = x.reshape(-1, width)
    m = x2.shape[0]
    weight_only = m <= settings.gemv_max_rows or plan.activations == "none"
    if not kernels_run(x2):
        if gate is not None:
            x2 = _act(x2, gate)
        acts = "none" if weight_only else plan.activations
        if plan.dequantized is None:
            plan.dequantized = weight.dequantize(
                torch.float32 if x2.device.type == "cpu" else x2.dtype
            )
        return reference.linear_ref(
            x2, weight, bias, activations=acts, dequantized=plan.dequantized
        ).view(*lead, -1)
    if weight_only and plan.packed is not None and x2.dtype in (torch.float16, torch.bfloat16):
        return packed_gemm(_act(x2, gate) if gate else x2, plan.packed, bias).view(*lead, -1)
    if m <= settings.gemv_max_rows and m > 0:
        from .kernels.gemv import gemv_triton

        return gemv_triton(x2, weight, bias, gate=gate).view(*lead, -1)
    if weight_only:
        from .kernels.gemm import gemm_triton

        return gemm_triton(_act(x2, gate) if gate else x2, weight, bias).view(*lead, -1)
    return _w8a8(x2, weight, plan, bias, settings, gate).view(*lead, -1)


def _w8a8(
    x: torch.Tensor,
    weight: Fp8Weight,
    plan: LayerPlan,
    bias: torch.Tensor | None,
    settings: Fp8Settings,
    gate: str | None,
) -> torch.Tensor:
    from .kernels.quantize import quantize_activations_triton
    from .scaled_mm import row_multiple, scaled_mm

    use_cublas = plan.scaled_mm and x.is_cuda
    q, scales = quantize_activations_triton(
        x,
        group=BLOCK if weight.block else None,
        static_scale=weight.input_scale if plan.activations == "static" else None,
        gate=gate,
        scales_column_major=use_cublas and weight.block,
        row_multiple=row_multiple(weight) if use_cublas else 1,
    )
    if use_cublas:
        return scaled_mm(q, scales, weight, bias, x.dtype, settings.fast_accum)[: x.shape[0]]
    from .kernels.gemm import gemm_triton

    return gemm_triton(q, weight, bias, a_scales=scales, out_dtype=x.dtype)


def warm_up(
    weight: Fp8Weight,
    plan: LayerPlan,
    dtype: torch.dtype,
    settings: Fp8Settings,
    gate: str | None = None,
) -> None:
    """Compile, before serving (and before any CUDA-graph capture), every kernel variant this
    layer's products can take: the GEMV's one-row and several-row forms, the activation
    quantization and the GEMM's small- and large-batch tiles (or ``torch._scaled_mm``, which
    compiles nothing). Each runs once on zeros."""
    if not kernels_run(weight.data):
        return
    if plan.packed is not None:
        packed_gemm_warm_up(plan.packed, dtype)
    width = weight.cols * (2 if gate is not None else 1)
    rows = {1, settings.gemv_max_rows, settings.gemv_max_rows + 1, 65}
    for m in sorted(r for r in rows if r > 0):
        x = torch.zeros(m, width, dtype=dtype, device=weight.data.device)
        linear(x, weight, plan, settings=settings, gate=gate)


def embedding(weight: Fp8Weight, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows ``ids`` (any shape) dequantized, ``[*ids.shape, cols]`` in ``dtype``."""
    flat = ids.reshape(-1)
    return weight.rows_of(flat).to(dtype).view(*ids.shape, weight.cols)
