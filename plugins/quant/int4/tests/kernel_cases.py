"""The plugin's Triton kernels against their torch references, on small shapes. Run on CPU
tensors under ``TRITON_INTERPRET=1`` (``test_interpret.py`` starts them so) and on a CUDA GPU
as they are (``python -m pytest kernel_cases.py`` there); without either they skip."""

from __future__ import annotations

import pytest
import torch

from int_weights import random_unpacked
from tallow.kernels import interpreting, triton_enabled
from tallow_quant_int4 import ops, reference
from tallow_quant_int4.kernels.dequant import dequantize_triton
from tallow_quant_int4.kernels.gemv import gemv_triton
from tallow_quant_int4.layout import dequantize, from_codes

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not triton_enabled(torch.empty(0, device=DEVICE)),
    reason="needs a CUDA GPU or TRITON_INTERPRET=1",
)

#: (bits, zero points, rows, cols, group)
LAYOUTS = [
    (4, False, 24, 256, 128),
    (4, True, 20, 192, 64),
    (8, False, 16, 128, 32),
    (8, True, 9, 64, 64),
    (4, False, 7, 96, 96),
]


def _weight(bits, zeros, rows, cols, group, seed=0, act_order=False):
    u = random_unpacked(
        rows, cols, bits=bits, group=group, zeros=zeros, seed=seed, act_order=act_order
    )
    return from_codes(u.codes, u.scales, u.zeros, bits, group_index=u.group_index).to(DEVICE)


def _check(got: torch.Tensor, want: torch.Tensor) -> None:
    """Close to the float32 reference up to the output dtype's rounding (and the order of
    float32 sums)."""
    tol = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3}[got.dtype]
    scale = max(1.0, float(want.abs().max()))
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * scale)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gemv_equals_the_reference(layout, m, dtype):
    w = _weight(*layout, seed=m)
    gen = torch.Generator().manual_seed(m)
    x = torch.randn(m, w.cols, generator=gen).to(DEVICE, dtype)
    bias = torch.randn(w.rows, generator=gen).to(DEVICE, dtype)
    _check(gemv_triton(x, w, bias), reference.linear_ref(x, w, bias))
    _check(gemv_triton(x, w), reference.linear_ref(x, w))


@pytest.mark.parametrize(
    "config",
    [(1, 1, 1, False), (2, 8, 2, True), (4, 2, 1, True), (1, 8, 4, True), (1, 8, 2, False)],
)
@pytest.mark.parametrize("cols", [320, 2336])
def test_gemv_configurations(config, cols):
    """Every (BM, BN, warps, prefetch): rows not a multiple of BN, quads not of the tile, the
    warps of a program along K (2336 columns: 73 quads, several iterations of 1 or 2 warps,
    one partly empty iteration of 4)."""
    w = _weight(4, True, 21, cols, 32, seed=3)
    x = torch.randn(config[0], w.cols, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    _check(gemv_triton(x, w, config=config), reference.linear_ref(x, w))


def test_gemv_writes_into_a_column_slice_of_a_wider_output():
    w = _weight(4, False, 16, 128, 128)
    x = torch.randn(2, 128, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    out = torch.full((2, 40), 7.0, device=DEVICE)
    gemv_triton(x, w, out=out[:, 8:24])
    _check(out[:, 8:24], reference.linear_ref(x, w))
    assert bool((out[:, :8] == 7).all()) and bool((out[:, 24:] == 7).all())


@pytest.mark.parametrize("gate", ["silu", "gelu_tanh"])
def test_gemv_applies_the_gate_as_it_reads_x(gate):
    w = _weight(4, False, 32, 128, 64)
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(4)).to(DEVICE, torch.bfloat16)
    activated = ops.activated(x, gate)
    _check(gemv_triton(x, w, gate=gate), reference.linear_ref(activated, w))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dequantize_gives_the_reference_values(layout, dtype):
    w = _weight(*layout)
    want = dequantize(w, dtype, natural_order=False)
    got = dequantize_triton(w, dtype)
    if interpreting() and dtype == torch.bfloat16:
        # the interpreter rounds float32 to bfloat16 toward zero, the GPU to nearest
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=0)
    else:
        assert torch.equal(got, want)
    ids = torch.tensor([2, 0, w.rows - 1], device=DEVICE)
    assert torch.equal(
        dequantize_triton(w, torch.float32, ids=ids),
        dequantize(w, torch.float32, natural_order=False)[ids],
    )


@pytest.mark.parametrize("m", [1, 5, 40])
def test_linear_with_act_order_and_merged_parts(m):
    """ops.linear: the small-batch kernel or the workspace, parts stacked along the rows, an
    act-order part reading x permuted, against the float32 product of the decoded weights."""
    parts = [
        _weight(4, False, 16, 128, 32, seed=1, act_order=True),
        _weight(4, True, 8, 128, 64, seed=2),
        torch.randn(8, 128, generator=torch.Generator().manual_seed(3)).to(DEVICE),
    ]
    x = torch.randn(m, 128, generator=torch.Generator().manual_seed(m)).to(DEVICE)
    bias = torch.randn(32, generator=torch.Generator().manual_seed(9)).to(DEVICE)
    dense = torch.cat([dequantize(parts[0]), dequantize(parts[1]), parts[2]])
    _check(ops.linear(x, parts, bias), x @ dense.T + bias)
    gated = torch.randn(m, 256, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    _check(
        ops.linear(gated, parts[:2], None, gate="silu"), ops.activated(gated, "silu") @ dense[:24].T
    )
