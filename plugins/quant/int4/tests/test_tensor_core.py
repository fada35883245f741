"""The opt-in tensor-core path: its re-layout decodes to the layout's own bits (CPU), its
kernels match the reference (``tensor_core_cases.py`` under the Triton interpreter), and the
setting ``kernel`` selects it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from int_weights import random_unpacked
from tallow.kernels import dequantize_packed_ref
from tallow.plugin.testing import run_interpreted
from tallow_quant_int4 import tensor_core
from tallow_quant_int4.formats import unpack_gptq
from tallow_quant_int4.layout import dequantize, from_codes
from tallow_quant_int4.settings import Int4Settings


@pytest.mark.parametrize(
    "bits,zeros,group,act_order",
    [
        (4, True, 128, False),
        (4, False, 128, False),
        (4, True, 64, True),
        (8, True, 32, False),
        (8, False, 128, False),
    ],
)
def test_relayout_is_bit_exact(bits, zeros, group, act_order):
    u = random_unpacked(
        12,
        256,
        bits=bits,
        group=group,
        zeros=zeros,
        seed=bits + group,
        act_order=act_order,
        scale_dtype=torch.bfloat16,
    )
    w = from_codes(u.codes, u.scales, u.zeros, bits, group_index=u.group_index)
    packed = tensor_core.to_packed(w)
    assert packed.kind == ("u4" if bits == 4 else "u8")
    assert torch.equal(
        dequantize_packed_ref(packed), dequantize(w, torch.float32, natural_order=False)
    )


def test_relayout_of_a_gptq_checkpoint_tensor():
    """From GPTQ's own packed tensors (qweight/qzeros/scales, g128) through the layout."""
    gen = torch.Generator().manual_seed(7)
    k, n, group = 256, 16, 128
    qweight = torch.randint(-(2**31), 2**31 - 1, (k // 8, n), generator=gen, dtype=torch.int64)
    qzeros = torch.randint(
        -(2**31), 2**31 - 1, (k // group, n // 8), generator=gen, dtype=torch.int64
    )
    scales = torch.rand(k // group, n, generator=gen).half()
    u = unpack_gptq(
        qweight.to(torch.int32),
        qzeros.to(torch.int32),
        scales,
        None,
        (n, k),
        zero_offset=1,
        what="q_proj",
    )
    w = from_codes(u.codes, u.scales, u.zeros, u.bits)
    assert torch.equal(
        dequantize_packed_ref(tensor_core.to_packed(w)), dequantize(w, torch.float32)
    )


def test_kernel_setting():
    assert Int4Settings().kernel == "default"
    assert Int4Settings(kernel="tensor_core").kernel == "tensor_core"
    with pytest.raises(ValueError, match="kernel"):
        Int4Settings(kernel="marlin")


def test_kernels_under_the_triton_interpreter() -> None:
    run_interpreted(Path(__file__).with_name("tensor_core_cases.py"))
