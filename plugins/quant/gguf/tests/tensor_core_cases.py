"""The tensor-core path (:mod:`tallow_quant_gguf.tensor_core`) against ``gguf``'s own
dequantization and the float32 product, at small shapes. Not collected on its own:
``test_tensor_core.py`` runs it with ``TRITON_INTERPRET=1``; on a CUDA machine
``python -m pytest tensor_core_cases.py`` runs it on the GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernel_cases import DEVICE, same_bits, weight
from tallow.kernels import dequantize_packed, packed_gemm, packed_gemm_config
from tallow.kernels import packed_gemm_tolerance
from tallow_quant_gguf import tensor_core

TYPES = sorted(tensor_core.TYPES)


@pytest.mark.parametrize("qtype", TYPES)
def test_kernel_decoding_is_ggufs_bits(qtype):
    """Every field value, extremes included (zeros, subnormals, infinities, NaN scales)."""
    import gguf

    blocks, packed = weight(qtype, 19, 512, "tensor_core", extremes=True)
    with np.errstate(all="ignore"):
        expected = torch.from_numpy(
            np.ascontiguousarray(
                gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[qtype]), dtype=np.float32
            )
        )
    same_bits(dequantize_packed(tensor_core.to_packed(packed)), expected, qtype)


@pytest.mark.parametrize("m", [1, 7, 16, 256])
@pytest.mark.parametrize("qtype", TYPES)
def test_product_within_rounding(qtype, m):
    # Q4_K's 256-element blocks: K = 512 (2 blocks) and 768 (3, an odd count of K tiles)
    k = 768 if m == 7 else 512
    _, packed = weight(qtype, 40, k, "tc product", m)
    w = tensor_core.to_packed(packed)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(DEVICE, torch.bfloat16)
    y = packed_gemm(x, w)
    dense = dequantize_packed(w)
    want = x.float() @ dense.T
    splits = packed_gemm_config(m, 40, k, w.kind).split_k
    assert bool(((y.float() - want).abs() <= packed_gemm_tolerance(x, dense, splits)).all())


def test_layers_under_the_setting_take_the_packed_gemm():
    """A merged Q4_K layer and a Q8_0 down projection with its activation, built by a scheme
    with ``matmul: tensor_core``: bfloat16 inputs go through the packed copies; a Q6_K layer
    keeps the default kernels."""
    from tallow.layers import (
        BuildContext,
        MergedColumnParallelLinear,
        QuantizedWeight,
        RowParallelLinear,
        SiluAndMul,
    )
    from tallow.plugin.testing import make_config
    from tallow_quant_gguf.reference import dequantize_ref
    from tallow_quant_gguf.scheme import GGUFQuantScheme

    config = make_config(
        {"plugins": {"settings": {"tallow-quant-gguf": {"matmul": "tensor_core"}}}}
    )
    build = BuildContext(
        dtype=torch.bfloat16, device=torch.device(DEVICE), quant=GGUFQuantScheme(config)
    )

    def quantized(qtype, rows, cols, seed):
        blocks, packed = weight(qtype, rows, cols, "layer", seed)
        return (
            QuantizedWeight("gguf", qtype, (rows, cols), torch.from_numpy(blocks), None),
            dequantize_ref(packed),
        )

    merged = MergedColumnParallelLinear(256, [24, 24], build=build, prefix="mlp.gate_up_proj")
    dense = []
    for shard in (0, 1):
        q, d = quantized("Q4_K", 24, 256, shard)
        merged.weight.weight_loader(merged.weight, q, shard)
        dense.append(d)
    merged.quant_method.process_weights_after_loading(merged)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(9)).to(DEVICE, torch.bfloat16)
    w = torch.cat(dense).to(DEVICE)
    y = merged(x)
    assert merged.quant_method._packed, "the packed GEMM was not used"
    splits = packed_gemm_config(5, 24, 256, "u4").split_k
    assert bool(((y.float() - x.float() @ w.T).abs() <= packed_gemm_tolerance(x, w, splits)).all())

    down = RowParallelLinear(256, 24, build=build, prefix="mlp.down_proj")
    q, w0 = quantized("Q8_0", 24, 256, 7)
    down.weight.weight_loader(down.weight, q)
    down.quant_method.process_weights_after_loading(down)
    act = SiluAndMul()
    xx = torch.randn(3, 512, generator=torch.Generator().manual_seed(4)).to(DEVICE, torch.bfloat16)
    a, w0 = act(xx), w0.to(DEVICE)
    y = down(xx, act=act)
    assert down.quant_method._packed
    splits = packed_gemm_config(3, 24, 256, "u8").split_k
    err = (y.float() - a.float() @ w0.T).abs()
    assert bool((err <= packed_gemm_tolerance(a, w0, splits)).all())

    other = RowParallelLinear(256, 24, build=build, prefix="mlp.o_proj")
    q, _ = quantized("Q6_K", 24, 256, 8)
    other.weight.weight_loader(other.weight, q)
    other.quant_method.process_weights_after_loading(other)
    other(x)
    assert not other.quant_method._packed
