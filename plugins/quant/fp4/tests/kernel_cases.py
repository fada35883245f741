"""The FP4 kernels against the torch reference on small shapes: on CPU tensors under
``TRITON_INTERPRET=1`` (``test_interpret.py``) and on a CUDA GPU as they are."""

from __future__ import annotations

import pytest
import torch

from fp4_checkpoints import random_fp4
from tallow.kernels import interpreting, triton_enabled
from tallow_quant_fp4 import ops
from tallow_quant_fp4.checkpoint import fp4_layout, unpack
from tallow_quant_fp4.kernels.dequant import dequantize_triton
from tallow_quant_fp4.kernels.gemv import gemv_triton
from tallow_quant_fp4.layout import dequantize, from_codes, scale_values

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(not triton_enabled(torch.empty(0, device=DEVICE)),
                                reason="needs a CUDA GPU or TRITON_INTERPRET=1")


def weight(kind: str, rows: int, cols: int, seed: int = 0):
    from fp4_checkpoints import CONFIGS

    layout = fp4_layout({"quantization_config": CONFIGS[kind]})
    codes, scales, g = unpack(layout, random_fp4(rows, cols, kind, seed), (rows, cols), "w")
    return from_codes(layout.kind, codes, scales, g).map_rows(lambda t: t.to(DEVICE))


def check(got, want):
    tol = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}[got.dtype]
    scale = max(1.0, float(want.abs().max()))
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("kind", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemv_equals_the_reference(kind, m, dtype):
    w = weight(kind, 20, 192, seed=m)
    x = torch.randn(m, 192, generator=torch.Generator().manual_seed(m)).to(DEVICE, dtype)
    bias = torch.randn(20, generator=torch.Generator().manual_seed(1)).to(DEVICE, dtype)
    check(gemv_triton(x, w, bias), ops.linear_ref(x, w, bias))


@pytest.mark.parametrize("kind", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("config", [(1, 8, 4, True), (2, 2, 2, False)])
def test_gemv_with_its_warps_along_k(kind, config):
    # 73 quads: several iterations, the last partly empty, rows not a multiple of BN
    w = weight(kind, 21, 2336, seed=5)
    x = torch.randn(config[0], 2336, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    check(gemv_triton(x, w, config=config), ops.linear_ref(x, w))


@pytest.mark.parametrize("kind", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dequantize_gives_the_reference_values(kind, dtype):
    w = weight(kind, 12, 128)
    got, want = dequantize_triton(w, dtype), dequantize(w, dtype)
    if interpreting() and dtype == torch.bfloat16:
        # the interpreter rounds float32 to bfloat16 toward zero, the GPU to nearest
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=0)
    else:
        assert torch.equal(got, want)


def test_the_nvfp4_scales_are_correctly_rounded_quotients():
    # the reference divides as the format does, on any device (torch on a GPU turns a division
    # by a CPU scalar into a product with its reciprocal, which rounds twice)
    codes = torch.arange(256, dtype=torch.uint8)
    codes = codes[(codes & 0x7F) != 0x7F].to(DEVICE)  # 0x7F and 0xFF are e4m3 NaNs
    for g in (40.0, 3.0, 0.7, 1234.5678):
        got = scale_values("nvfp4", codes, g)
        divisor = torch.tensor(g, dtype=torch.float32, device=DEVICE).double()
        # float64 quotients of float32 values, rounded to float32: the correctly rounded ones
        exact = codes.view(torch.float8_e4m3fn).double() / divisor
        assert torch.equal(got, exact.float()), g


@pytest.mark.parametrize("m", [1, 40])
def test_linear_with_gate_and_parts(m):
    parts = [weight("mxfp4", 16, 128, seed=1), weight("mxfp4", 8, 128, seed=2)]
    x = torch.randn(m, 256, generator=torch.Generator().manual_seed(m)).to(DEVICE)
    dense = torch.cat([dequantize(p) for p in parts])
    check(ops.linear(x, parts, gate="silu"), ops._act(x, "silu") @ dense.T)
