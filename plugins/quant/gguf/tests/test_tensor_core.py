"""The opt-in tensor-core path: re-laid GGML weights decode to the bits of ``gguf``'s own
dequantization (CPU, and the kernels' own decoding in ``tensor_core_cases.py`` under the
Triton interpreter), and ``matmul: tensor_core`` is a valid setting."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from quant_blocks import random_blocks
from tallow.kernels import dequantize_packed_ref
from tallow.plugin.testing import run_interpreted
from tallow_quant_gguf import tensor_core
from tallow_quant_gguf.packing import pack
from tallow_quant_gguf.qtypes import QUANT_TYPES
from tallow_quant_gguf.scheme import KernelPolicy


@pytest.mark.parametrize("qtype", sorted(tensor_core.TYPES))
def test_relayout_is_bit_exact(qtype):
    import gguf

    blocks = random_blocks(qtype, 9, 1024 // QUANT_TYPES[qtype].block, seed=len(qtype))
    packed = pack(torch.from_numpy(blocks), qtype)
    with np.errstate(all="ignore"):
        expected = torch.from_numpy(
            np.ascontiguousarray(
                gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[qtype]), dtype=np.float32
            )
        )
    got = dequantize_packed_ref(tensor_core.to_packed(packed))
    both_nan = torch.isnan(got) & torch.isnan(expected)
    assert bool(((got.view(torch.int32) == expected.view(torch.int32)) | both_nan).all())


def test_scales_kept_narrow_where_exact():
    q40 = tensor_core.to_packed(pack(torch.from_numpy(random_blocks("Q4_0", 4, 2, 1)), "Q4_0"))
    q4k = tensor_core.to_packed(
        pack(torch.from_numpy(random_blocks("Q4_K", 4, 2, 1, extremes=False)), "Q4_K")
    )
    assert q40.scales.dtype == torch.float16 and q40.mins is None and q40.zero_point == 8
    assert q4k.scales.dtype == torch.float32 and q4k.mins is not None


def test_other_types_are_refused_by_name():
    q6 = pack(torch.from_numpy(random_blocks("Q6_K", 2, 1)), "Q6_K")
    with pytest.raises(ValueError, match="not Q6_K"):
        tensor_core.to_packed(q6)
    assert not tensor_core.applies(torch.zeros(1, 256, dtype=torch.bfloat16), [q6])


def test_matmul_setting():
    assert KernelPolicy.from_settings({"matmul": "tensor_core"}).matmul == "tensor_core"
    with pytest.raises(ValueError, match="matmul"):
        KernelPolicy.from_settings({"matmul": "marlin"})


def test_kernels_under_the_triton_interpreter() -> None:
    run_interpreted(Path(__file__).with_name("tensor_core_cases.py"))
