"""The plugin's Triton kernels against their torch references, at small shapes.

Not collected on its own (no ``test_`` prefix): ``test_interpret.py`` runs it in a subprocess
with ``TRITON_INTERPRET=1`` so the kernels execute on the CPU, and on a CUDA machine
``python -m pytest plugins/quant/fp8/tests/kernel_cases.py`` runs it on the GPU (the
``fp8tests`` item of ``bench/gpu/run_all.sh``). Random inputs from the test seed; set
TALLOW_TEST_SEED to replay one.
"""

from __future__ import annotations

import zlib

import pytest
import torch

from tallow.plugin.testing.seeds import base_seed
from tallow.kernels import interpreting
from tallow_quant_fp8 import ops, reference
from tallow_quant_fp8.kernels.gemm import gemm_triton
from tallow_quant_fp8.kernels.gemv import gemv_triton
from tallow_quant_fp8.kernels.quantize import quantize_activations_triton
from tallow_quant_fp8.ops import LayerPlan
from tallow_quant_fp8.settings import Fp8Settings
from tallow_quant_fp8.weights import BLOCK, Fp8Weight, quantize_rows

if interpreting():
    DEVICE = "cpu"
elif torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9):
    DEVICE = "cuda"
else:
    pytest.skip(
        "needs a CUDA GPU of compute capability 8.9+ or TRITON_INTERPRET=1 set before "
        "triton is imported (test_interpret.py runs this module that way)",
        allow_module_level=True,
    )

BASE_SEED = base_seed()
#: activation dtypes: the interpreter computes in float32 (numpy has no bfloat16 matmul)
DTYPES = [torch.float32] if DEVICE == "cpu" else [torch.bfloat16, torch.float16]


def gen(*parts: object) -> torch.Generator:
    seed = (zlib.crc32(repr(parts).encode()) ^ BASE_SEED) % (2**31)
    return torch.Generator(device=DEVICE).manual_seed(seed)


def randn(
    *shape: int, g: torch.Generator, scale: float = 1.0, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    return (torch.randn(*shape, generator=g, device=DEVICE) * scale).to(dtype)


def random_weight(n: int, k: int, layout: str, g: torch.Generator) -> Fp8Weight:
    """A weight with random e4m3 values (the whole range, outliers included) and scales."""
    w = quantize_rows(randn(n, k, g=g) * torch.rand(n, 1, generator=g, device=DEVICE) * 3)
    if layout == "row":
        return w
    blocks = torch.rand(-(-n // BLOCK), -(-k // BLOCK), generator=g, device=DEVICE) * 0.02 + 1e-3
    return Fp8Weight(w.data, blocks, "block")


def close(
    got: torch.Tensor,
    x: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    what: str,
    tol: float | None = None,
) -> None:
    """``got`` is ``x @ w.T + bias`` (x and w already the exact values multiplied) up to the
    order of float32 additions and the output dtype: every value within a fraction of
    ``|x| @ |w|.T``, the scale of its terms."""
    x64, w64 = x.double(), w.double()
    ref = x64 @ w64.T + (bias.double() if bias is not None else 0)
    scale = x64.abs() @ w64.abs().T + 1e-6
    if tol is None:
        tol = 1e-5 if got.dtype == torch.float32 else 1e-2
    err = ((got.double() - ref).abs() / scale).max().item()
    assert err <= tol, f"{what} (TALLOW_TEST_SEED={BASE_SEED}): relative error {err:.3g}"


def same_values(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Equal as values (+0 and -0 alike), on the CPU."""
    got, expected = got.float().cpu(), expected.float().cpu()
    differ = got != expected
    assert not differ.any(), (
        f"{what} (TALLOW_TEST_SEED={BASE_SEED}): {int(differ.sum())} "
        f"values differ, first at {differ.nonzero()[0].tolist()}: "
        f"{got[differ][:4].tolist()} vs {expected[differ][:4].tolist()}"
    )


@pytest.mark.parametrize("group", [None, BLOCK])
@pytest.mark.parametrize("m,k", [(1, 128), (5, 896), (3, 4096), (17, 384)])
def test_activation_quantization_gives_the_reference_bits(group, m, k):
    g = gen("quant", group, m, k)
    for dtype in DTYPES:
        x = randn(m, k, g=g, scale=4.0, dtype=dtype)
        x[0, :7] = torch.tensor([0.0, 1e-9, -3e-3, 448.0, -1e4, 0.5, 2.0**-9]).to(dtype)
        if m > 2:
            x[2] = 0  # a row of zeros: scale at its floor, values zero
        q, s = quantize_activations_triton(x, group=group)
        q_ref, s_ref = reference.quantize_activations_ref(x, group)
        same_values(s, s_ref, f"scales, group {group}, {dtype}")
        same_values(q, q_ref, f"values, group {group}, {dtype}")


def test_static_scale_and_column_major_scales():
    g = gen("static")
    x = randn(6, 256, g=g, scale=3.0)
    static = torch.tensor([0.0125], device=DEVICE)
    q, s = quantize_activations_triton(x, static_scale=static)
    q_ref, s_ref = reference.quantize_activations_ref(x, None, static)
    same_values(q, q_ref, "static values")
    same_values(s, s_ref, "static scales")
    q, s = quantize_activations_triton(x, group=BLOCK, scales_column_major=True)
    assert s.stride() == (1, 6) and s.shape == (6, 2)
    same_values(s, reference.quantize_activations_ref(x, BLOCK)[1], "column-major scales")
    # padded to a multiple of 4 rows (cuBLAS's block-scaled GEMM): zeros, scales of one
    q, s = quantize_activations_triton(x, group=BLOCK, scales_column_major=True, row_multiple=4)
    assert q.shape == (8, 256) and s.shape == (8, 2) and s.stride() == (1, 8)
    q_ref, s_ref = reference.quantize_activations_ref(x, BLOCK)
    same_values(q[:6], q_ref, "padded values")
    same_values(s[:6], s_ref, "padded scales")
    assert not q[6:].float().any() and bool((s[6:] == 1).all())


@pytest.mark.parametrize("kind", ["silu", "gelu_tanh"])
def test_quantization_applies_the_gate(kind):
    # the activation kernel's own values (its float32 exp is not torch's)
    from tallow.kernels import gelu_tanh_and_mul, silu_and_mul

    act = silu_and_mul if kind == "silu" else gelu_tanh_and_mul
    g = gen("gate", kind)
    for dtype in DTYPES:
        x = randn(4, 2 * 384, g=g, scale=2.0, dtype=dtype)
        for group in (None, BLOCK):
            q, s = quantize_activations_triton(x, group=group, gate=kind)
            q_ref, s_ref = reference.quantize_activations_ref(act(x), group)
            same_values(s, s_ref, f"{kind} scales")
            same_values(q, q_ref, f"{kind} values")


@pytest.mark.parametrize("layout", ["row", "block"])
@pytest.mark.parametrize("m", [1, 2, 7, 16])
@pytest.mark.parametrize("n,k", [(256, 512), (200, 896), (128, 4096)])
def test_gemv_equals_the_dequantized_product(layout, m, n, k):
    g = gen("gemv", layout, m, n, k)
    w = random_weight(n, k, layout, g)
    bias = randn(n, g=g)
    for dtype in DTYPES:
        x = randn(m, k, g=g, dtype=dtype)
        for b in (None, bias.to(dtype)):
            got = gemv_triton(x, w, b)
            assert got.dtype == dtype and got.shape == (m, n)
            close(got, x.float(), w.dequantize(), b, f"gemv {layout} m={m} [{n},{k}] {dtype}")


@pytest.mark.parametrize("kind", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("m", [1, 5])
def test_gemv_applies_the_gate(kind, m):
    from tallow.kernels import gelu_tanh_and_mul, silu_and_mul

    act = silu_and_mul if kind == "silu" else gelu_tanh_and_mul
    g = gen("gemv-gate", kind, m)
    for layout in ("row", "block"):
        w = random_weight(192, 384, layout, g)
        for dtype in DTYPES:
            x = randn(m, 768, g=g, dtype=dtype)
            close(
                gemv_triton(x, w, gate=kind),
                act(x).float(),
                w.dequantize(),
                None,
                f"gated gemv {kind} {layout} {dtype}",
            )


@pytest.mark.parametrize(
    "layout,mode", [("row", "float"), ("row", "token"), ("block", "float"), ("block", "group")]
)
@pytest.mark.parametrize("m,n,k", [(17, 256, 384), (70, 384, 1024), (130, 128, 256)])
def test_gemm_equals_the_dequantized_product(layout, mode, m, n, k):
    g = gen("gemm", layout, mode, m, n, k)
    w = random_weight(n, k, layout, g)
    bias = randn(n, g=g)
    for dtype in DTYPES:
        x = randn(m, k, g=g, scale=2.0, dtype=dtype)
        if mode == "float":
            got = gemm_triton(x, w, bias.to(dtype))
            exact = x.float()
        else:
            group = BLOCK if mode == "group" else None
            q, s = quantize_activations_triton(x, group=group)
            got = gemm_triton(q, w, bias.to(dtype), a_scales=s, out_dtype=dtype)
            exact = reference.dequantize_activations(q, s)
        assert got.dtype == dtype and got.shape == (m, n)
        close(got, exact, w.dequantize(), bias.to(dtype), f"gemm {layout} {mode} m={m} {dtype}")


@pytest.mark.parametrize(
    "layout,activations", [("row", "token"), ("row", "static"), ("block", "group"), ("row", "none")]
)
@pytest.mark.parametrize("m", [1, 9, 40])
def test_linear_follows_the_reference_at_every_row_count(layout, activations, m):
    """The dispatch of ``ops.linear`` (GEMV up to 16 rows, W8A8 or weight-only GEMM beyond)
    computes what the reference computes for the same rows."""
    g = gen("linear", layout, activations, m)
    w = random_weight(256, 512, layout, g)
    if activations == "static":
        w = Fp8Weight(w.data, w.scale, w.layout, torch.tensor(0.01, device=DEVICE))
    plan = LayerPlan(activations, scaled_mm=False)
    settings = Fp8Settings(matmul="triton")
    for dtype in DTYPES:
        x = randn(m, 512, g=g, dtype=dtype)
        got = ops.linear(x, w, plan, settings=settings)
        acts = "none" if m <= settings.gemv_max_rows else activations
        expected = reference.linear_ref(x, w, activations=acts)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        err = ((got.float() - expected.float()).abs().max() / expected.float().abs().max()).item()
        assert err <= tol, f"{layout} {activations} m={m} {dtype}: {err:.3g}"
