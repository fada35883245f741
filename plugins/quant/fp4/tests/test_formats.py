"""FP4 checkpoint tensors against independent implementations: MXFP4 in gpt-oss's layout
against transformers' own dequantization of gpt-oss blocks (``convert_moe_packed_tensors``'
implementation, one expert of a dense layer's shape); compressed-tensors' NVFP4 and MXFP4
(``nvfp4-pack-quantized``, ``mxfp4-pack-quantized``) against the package's decompression; and
load-time MXFP4 against the OCP rules."""

from __future__ import annotations

import pytest
import torch

from fp4_checkpoints import CONFIGS, random_fp4
from tallow_quant_fp4.checkpoint import fp4_layout, holds_fp4_weights, unpack
from tallow_quant_fp4.isq import quantize_mxfp4
from tallow_quant_fp4.layout import dequantize, from_codes


def ours(kind: str, t: dict[str, torch.Tensor], shape: tuple[int, int]) -> torch.Tensor:
    layout = fp4_layout({"quantization_config": CONFIGS[kind]})
    codes, scales, global_scale = unpack(layout, t, shape, "test")
    return dequantize(from_codes(layout.kind, codes, scales, global_scale))


def test_mxfp4_equals_transformers_gpt_oss_dequantization():
    mxfp4 = pytest.importorskip("transformers.integrations.mxfp4")
    t = random_fp4(64, 256, "mxfp4", seed=1)
    # gpt-oss stores experts as [experts, rows, blocks, 16]; the result is [experts, K, N]
    expected = mxfp4._convert_moe_packed_tensors(
        t["weight_blocks"][None], t["weight_scales"][None], dtype=torch.float32
    )[0].T
    assert torch.equal(ours("mxfp4", t, (64, 256)), expected)


@pytest.mark.parametrize("kind", ["nvfp4", "ct-mxfp4"])
def test_compressed_tensors_fp4_equals_the_packages_decompression(kind):
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors import MXFP4PackedCompressor, NVFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    group = 16 if kind == "nvfp4" else 32
    args = QuantizationArgs(
        num_bits=4,
        type="float",
        symmetric=True,
        strategy="tensor_group" if kind == "nvfp4" else "group",
        group_size=group,
    )
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    t = random_fp4(48, 256, kind, seed=2)
    compressor = NVFP4PackedCompressor if kind == "nvfp4" else MXFP4PackedCompressor
    expected = compressor.decompress(dict(t), scheme)["weight"]
    got = ours(kind, t, (48, 256))
    torch.testing.assert_close(got.to(expected.dtype), expected, rtol=0, atol=0)


def test_detection_and_refusals():
    assert holds_fp4_weights({"quantization_config": CONFIGS["nvfp4"]})
    assert holds_fp4_weights({"quantization_config": CONFIGS["mxfp4"]})
    int4 = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}},
    }
    assert not holds_fp4_weights({"quantization_config": int4})
    bad = {**CONFIGS["nvfp4"], "format": "nvfp4-naive"}
    with pytest.raises(ValueError, match=r"quantization_config\.format: 'nvfp4-naive'"):
        fp4_layout({"quantization_config": bad})
    t = random_fp4(16, 64, "mxfp4")
    layout = fp4_layout({"quantization_config": CONFIGS["mxfp4"]})
    with pytest.raises(ValueError, match="weight_blocks"):
        unpack(layout, {**t, "weight_blocks": t["weight_blocks"][:8]}, (16, 64), "layer")


def test_load_time_mxfp4_follows_the_microscaling_rules():
    w = torch.randn(16, 96, generator=torch.Generator().manual_seed(0))
    q = quantize_mxfp4(w, torch.device("cpu"))
    decoded = dequantize(q)
    blocks = w.reshape(16, 3, 32)
    exp = torch.floor(torch.log2(blocks.abs().amax(-1))) - 2
    assert torch.equal(q.scales.to(torch.int32), (exp + 127).to(torch.int32))
    scale = torch.exp2(exp).repeat_interleave(32, dim=1)
    # every value the nearest e2m1 multiple of its scale (within the largest, 6)
    grid = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    scaled = (w / scale).abs().clamp(max=6)
    nearest = (scaled[..., None] - grid).abs().min(-1).values
    assert torch.allclose(
        (decoded / scale).abs() - scaled, torch.zeros_like(scaled), atol=float(nearest.max()) + 1e-6
    )
    assert torch.equal(
        (decoded / scale).abs()[..., None].sub(grid).abs().min(-1).values, torch.zeros_like(scaled)
    )
    assert quantize_mxfp4(torch.randn(4, 48), torch.device("cpu")) is None
