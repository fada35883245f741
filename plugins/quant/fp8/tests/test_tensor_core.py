"""The opt-in tensor-core path: the re-laid weight decodes to :meth:`Fp8Weight.dequantize`'s
bits (CPU, and the kernels' own decoding in ``tensor_core_cases.py`` under the Triton
interpreter), and ``kernel`` is a validated setting."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tallow.kernels import dequantize_packed_ref
from tallow.plugin.testing import run_interpreted
from tallow_quant_fp8.settings import Fp8Settings
from tallow_quant_fp8.tensor_core import to_packed
from tallow_quant_fp8.weights import Fp8Weight, quantize_rows


@pytest.mark.parametrize("layout,n,k", [("row", 24, 200), ("block", 200, 384)])
def test_relayout_is_bit_exact(layout, n, k):
    g = torch.Generator().manual_seed(n)
    w = quantize_rows(torch.randn(n, k, generator=g) * 3)
    if layout == "block":
        w = Fp8Weight(w.data, torch.rand(2, 3, generator=g) * 0.02 + 1e-3, "block")
    packed = to_packed(w)
    assert packed.kind == "fp8" and packed.codes.shape == (k, n)
    assert torch.equal(dequantize_packed_ref(packed), w.dequantize())


def test_kernel_setting():
    assert Fp8Settings.from_settings({}).kernel == "default"
    assert Fp8Settings.from_settings({"kernel": "tensor_core"}).kernel == "tensor_core"
    with pytest.raises(ValueError, match="kernel: expected one of default, tensor_core"):
        Fp8Settings.from_settings({"kernel": "marlin"})


def test_kernels_under_the_triton_interpreter() -> None:
    run_interpreted(Path(__file__).with_name("tensor_core_cases.py"))
