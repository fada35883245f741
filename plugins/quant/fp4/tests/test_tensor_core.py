"""The opt-in tensor-core path: re-laid MXFP4/NVFP4 weights decode to the layout's own bits
(CPU, and the kernels' own decoding in ``tensor_core_cases.py`` under the Triton interpreter),
and ``kernel`` is a validated setting."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fp4_checkpoints import CONFIGS, random_fp4
from tallow.kernels import dequantize_packed_ref
from tallow.plugin.testing import run_interpreted
from tallow_quant_fp4.checkpoint import fp4_layout, unpack
from tallow_quant_fp4.layout import dequantize, from_codes
from tallow_quant_fp4.scheme import FP4QuantScheme
from tallow_quant_fp4.settings import FP4Settings
from tallow_quant_fp4.tensor_core import to_packed


@pytest.mark.parametrize("kind", ["mxfp4", "nvfp4"])
def test_relayout_is_bit_exact(kind):
    layout = fp4_layout({"quantization_config": CONFIGS[kind]})
    codes, scales, g = unpack(layout, random_fp4(12, 512, kind, 5), (12, 512), "w")
    w = from_codes(layout.kind, codes, scales, g)
    packed = to_packed(w)
    assert packed.kind == "e2m1" and packed.group == w.group
    assert torch.equal(dequantize_packed_ref(packed), dequantize(w))


def test_every_e2m1_code_and_scale_byte():
    """All 16 codes under MXFP4 scale bytes from 2^-127 to 2^127 (bfloat16 holds each)."""
    codes = torch.arange(16, dtype=torch.uint8).repeat(255, 2)  # [255, 32]
    scales = torch.arange(255, dtype=torch.uint8)[:, None]
    w = from_codes("mxfp4", codes, scales)
    got, want = dequantize_packed_ref(to_packed(w)), dequantize(w)
    assert torch.equal(got, want) and torch.equal(torch.signbit(got), torch.signbit(want))


def test_kernel_setting():
    assert FP4Settings().kernel == "default"
    assert FP4QuantScheme().settings.kernel == "default"
    with pytest.raises(ValueError, match="kernel"):
        FP4Settings(kernel="marlin")


def test_kernels_under_the_triton_interpreter() -> None:
    run_interpreted(Path(__file__).with_name("tensor_core_cases.py"))
