"""The tensor-core path (:mod:`tallow_quant_int4.tensor_core`) against the plugin's reference, at
small shapes. Not collected on its own: ``test_tensor_core.py`` runs it with
``TRITON_INTERPRET=1``; on a CUDA machine ``python -m pytest tensor_core_cases.py`` runs it on
the GPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from int_weights import random_unpacked
from tallow.kernels import dequantize_packed, packed_gemm_config, packed_gemm_tolerance
from tallow.kernels import triton_enabled
from tallow_quant_int4 import tensor_core
from tallow_quant_int4.layout import dequantize, from_codes
from tallow_quant_int4.reference import permuted_input

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not triton_enabled(torch.empty(0, device=DEVICE)),
    reason="needs a CUDA GPU or TRITON_INTERPRET=1",
)

#: (bits, zero points, rows, cols, group, act order): GPTQ/AWQ g128 with and without zero
#: points, g64, act-order, int8 g32, per-channel
LAYOUTS = [
    (4, True, 24, 256, 128, False),
    (4, False, 40, 192, 64, False),
    (4, True, 16, 256, 128, True),
    (8, False, 24, 128, 32, False),
    (4, False, 20, 96, 96, False),
]


def _weight(bits, zeros, rows, cols, group, act_order, seed=0):
    u = random_unpacked(
        rows, cols, bits=bits, group=group, zeros=zeros, seed=seed, act_order=act_order
    )
    return from_codes(u.codes, u.scales, u.zeros, bits, group_index=u.group_index).to(DEVICE)


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_kernel_decoding_is_the_layouts_bits(layout):
    w = _weight(*layout)
    got = dequantize_packed(tensor_core.to_packed(w))
    assert torch.equal(got, dequantize(w, torch.float32, natural_order=False))


@pytest.mark.parametrize("m", [1, 7, 16, 256])
@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_product_within_rounding(layout, m):
    w = _weight(*layout, seed=m)
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, w.cols, generator=g).to(DEVICE, torch.bfloat16)
    y = tensor_core.linear(x, [w], [tensor_core.to_packed(w)], None)
    weight = dequantize(w, torch.float32, natural_order=False)
    xp = permuted_input(x, w)
    want = xp.float() @ weight.T
    splits = packed_gemm_config(m, w.rows, w.cols, "u4" if w.bits == 4 else "u8").split_k
    assert bool(((y.float() - want).abs() <= packed_gemm_tolerance(xp, weight, splits)).all())


def test_stacked_parts_with_bias():
    parts = [
        _weight(4, True, 24, 256, 128, False, seed=1),
        _weight(4, False, 8, 256, 128, False, seed=2),
    ]
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(3)).to(DEVICE, torch.float16)
    bias = torch.randn(32, generator=torch.Generator().manual_seed(4)).to(DEVICE, torch.float16)
    y = tensor_core.linear(x, parts, [tensor_core.to_packed(p) for p in parts], bias)
    weight = torch.cat([dequantize(p, torch.float32) for p in parts])
    want = x.float() @ weight.T + bias.float()
    splits = packed_gemm_config(3, 24, 256, "u4").split_k
    tol = packed_gemm_tolerance(x, weight, splits) + 2.0**-11 * bias.float().abs()
    assert y.shape == (3, 32) and bool(((y.float() - want).abs() <= tol).all())


def test_layers_under_the_setting_take_the_packed_gemm():
    """A merged GPTQ layer and a down projection with its activation, built by a scheme with
    ``kernel: tensor_core``: bfloat16 inputs go through the packed copies."""
    from int_weights import dense_of
    from test_conformance import gptq_config
    from tallow.layers import BuildContext, MergedColumnParallelLinear, RowParallelLinear
    from tallow.layers import SiluAndMul
    from tallow.plugin.testing import make_config
    from tallow_quant_int4.formats import pack_gptq
    from tallow_quant_int4.scheme import IntQuantScheme

    config = make_config(
        {"plugins": {"settings": {"tallow-quant-int4": {"kernel": "tensor_core"}}}}
    )
    scheme = IntQuantScheme(config)
    scheme.use_checkpoint_config(gptq_config(4, 64, sym=False))
    build = BuildContext(dtype=torch.bfloat16, device=torch.device(DEVICE), quant=scheme)
    us = [random_unpacked(24, 128, group=64, zeros=True, seed=s) for s in (1, 2)]
    # GPTQ v1 stores zero - 1: a zero of 0 has no encoding
    us = [dataclasses.replace(u, zeros=u.zeros.clamp(min=1)) for u in us]
    merged = MergedColumnParallelLinear(128, [24, 24], build=build, prefix="mlp.gate_up_proj")
    for shard, u in enumerate(us):
        for name, t in pack_gptq(u, zero_offset=1).items():
            getattr(merged, name).weight_loader(getattr(merged, name), t, shard)
    merged.quant_method.process_weights_after_loading(merged)
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(9)).to(DEVICE, torch.bfloat16)
    dense = torch.cat([dense_of(u) for u in us]).to(DEVICE)
    y = merged(x)
    assert merged.quant_method._packed, "the packed GEMM was not used"
    splits = packed_gemm_config(5, 24, 128, "u4").split_k
    assert bool(
        ((y.float() - x.float() @ dense.T).abs() <= packed_gemm_tolerance(x, dense, splits)).all()
    )

    down = RowParallelLinear(128, 24, build=build, prefix="mlp.down_proj")
    for name, t in pack_gptq(us[0], zero_offset=1).items():
        getattr(down, name).weight_loader(getattr(down, name), t)
    down.quant_method.process_weights_after_loading(down)
    act = SiluAndMul()
    xx = torch.randn(3, 256, generator=torch.Generator().manual_seed(4)).to(DEVICE, torch.bfloat16)
    a = act(xx)
    y = down(xx, act=act)
    assert down.quant_method._packed
    w0 = dense_of(us[0]).to(DEVICE)
    splits = packed_gemm_config(3, 24, 128, "u4").split_k
    err = (y.float() - a.float() @ w0.T).abs()
    assert bool((err <= packed_gemm_tolerance(a, w0, splits)).all())
