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
pytestmark = pytest.mark.skipif(
    not triton_enabled(torch.empty(0, device=DEVICE)),
    reason="needs a CUDA GPU or TRITON_INTERPRET=1",
)


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
    check(ops.linear(x, parts, gate="silu"), ops.activated(x, "silu") @ dense.T)


# -- MXFP4 experts (gpt-oss) ------------------------------------------------------------------
def mx_experts(e: int, rows: int, cols: int, seed: int):
    """Random MXFP4 experts ``(blocks [e, rows, cols/32, 16], scales [e, rows, cols/32])``:
    every code, scales around 2**-3."""
    gen = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (e, rows, cols // 32, 16), generator=gen, dtype=torch.int32)
    scales = 124 + torch.randint(-2, 3, (e, rows, cols // 32), generator=gen, dtype=torch.int32)
    return blocks.to(torch.uint8).to(DEVICE), scales.to(torch.uint8).to(DEVICE)


@pytest.mark.parametrize("tokens", [1, 3, 12])  # the decoding kernels, then workspace + GEMM
@pytest.mark.parametrize("activation", ["swiglu_clamp", "silu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mxfp4_experts_equal_the_reference(tokens, activation, dtype):
    from tallow_quant_fp4.moe_ops import GEMV_MAX_TOKENS, mxfp4_moe, mxfp4_moe_ref

    e, h, i, top_k = 8, 64, 96, 4
    seed = tokens * 7 + len(activation)
    w13, w2 = mx_experts(e, 2 * i, h, seed), mx_experts(e, h, i, seed + 1)
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(tokens, h, generator=gen) * 0.5).to(dtype).to(DEVICE)
    ids = torch.stack([torch.randperm(e, generator=gen)[:top_k] for _ in range(tokens)])
    weights = torch.rand(tokens, top_k, generator=gen).softmax(-1)
    b13 = (torch.randn(e, 2 * i, generator=gen) * 0.3).to(dtype).to(DEVICE)
    b2 = (torch.randn(e, h, generator=gen) * 0.3).to(dtype).to(DEVICE)
    ids, weights = ids.to(DEVICE), weights.to(DEVICE)
    args = dict(activation=activation, w13_bias=b13, w2_bias=b2, swiglu_limit=2.0)
    got = mxfp4_moe(x, w13, w2, weights, ids, **args)
    want = mxfp4_moe_ref(x, w13, w2, weights, ids, **args)
    assert (tokens <= GEMV_MAX_TOKENS) == (tokens < 12)
    check(got, want)
    # no biases: the kernels' other variant
    check(
        mxfp4_moe(x, w13, w2, weights, ids, activation=activation),
        mxfp4_moe_ref(x, w13, w2, weights, ids, activation=activation),
    )


def test_dequantize_selected_decodes_exactly_the_selected_experts():
    from tallow_quant_fp4.moe_ops import dequantize_experts, dequantize_selected

    blocks, scales = mx_experts(6, 40, 96, seed=3)  # rows not a multiple of the row block
    used = torch.tensor([0, 1, 0, 0, 1, 1], dtype=torch.int32, device=DEVICE)
    got = dequantize_selected(blocks, scales, used, torch.float32)
    want = dequantize_experts(blocks, scales)
    for expert in (1, 4, 5):
        assert torch.equal(got[expert], want[expert]), expert
