"""The checkpoint layouts (``tallow_quant_int4.formats``) against independent implementations:

- AWQ (GEMM packing, interleaved order, zero points): AutoAWQ's own pure-torch unpacking,
  ``awq.utils.packing_utils.dequantize_gemm``;
- GPTQ (rows of codes packed along the input, zero points minus one in format ``gptq``):
  AutoAWQ's conversion of AWQ tensors into the GPTQ/ExLlama layout
  (``unpack_reorder_pack``, which packs with ``pack_exllama`` and stores each zero point minus
  one, GPTQ's convention) read back by this plugin's GPTQ unpacker;
- compressed-tensors ``pack-quantized``: the ``compressed-tensors`` package's compressor packs
  and decompresses;
- Marlin: no maintained implementation runs on a CPU (its packer ships beside CUDA kernels);
  the round trip through this plugin's packer, written from Marlin's definition of the
  permutations, and a hand-checked element of the tile order stand in.

AutoAWQ is loaded from its file (``awq/utils/packing_utils.py``, pure torch): its package
``__init__`` imports training dependencies that are not needed here.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from int_weights import dense_of, random_unpacked
from tallow_quant_int4.formats import (
    Unpacked,
    marlin_permutations,
    pack_awq,
    pack_gptq,
    pack_marlin,
    unpack_awq,
    unpack_compressed,
    unpack_gptq,
    unpack_marlin,
)


def _awq_packing():
    spec = importlib.util.find_spec("awq")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("needs autoawq (test extra: pip install --no-deps autoawq)")
    path = Path(list(spec.submodule_search_locations)[0]) / "utils" / "packing_utils.py"
    loader = importlib.util.spec_from_file_location("awq_packing_utils", path)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return module


@pytest.mark.parametrize("group", [128, 64])
def test_awq_unpacking_equals_autoawq(group):
    awq = _awq_packing()
    u = random_unpacked(64, 256, group=group, zeros=True, seed=group)
    t = pack_awq(u)
    expected = awq.dequantize_gemm(t["qweight"], t["qzeros"], t["scales"].float(), 4, group)
    ours = unpack_awq(t["qweight"], t["qzeros"], t["scales"], (64, 256))
    assert torch.equal(dense_of(ours), expected.T.float())
    assert torch.equal(dense_of(ours), dense_of(u))


def test_gptq_v1_unpacking_reads_autoawqs_gptq_layout():
    """AutoAWQ turns AWQ tensors into GPTQ's (ExLlama's) layout with zero points stored minus
    one; this plugin's GPTQ reader with ``zero_offset=1`` gives back the AWQ weight."""
    awq = _awq_packing()
    u = random_unpacked(64, 256, group=128, zeros=True, seed=3)
    u = Unpacked(u.codes, u.scales, u.zeros.clamp(min=1), 4)  # v1 cannot store a zero of 0
    a = pack_awq(u)
    qweight, qzeros = awq.unpack_reorder_pack(a["qweight"], a["qzeros"], 4)
    ours = unpack_gptq(qweight, qzeros, a["scales"], None, (64, 256), zero_offset=1)
    assert torch.equal(ours.codes, u.codes) and torch.equal(ours.zeros, u.zeros)
    assert torch.equal(
        dense_of(ours),
        awq.dequantize_gemm(a["qweight"], a["qzeros"], a["scales"].float(), 4, 128).T.float(),
    )


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_round_trip(bits, offset, act_order):
    u = random_unpacked(
        32, 256, bits=bits, group=64, zeros=True, act_order=act_order, seed=bits + offset
    )
    u = Unpacked(u.codes, u.scales, u.zeros.clamp(min=offset), bits, u.group_index)
    t = pack_gptq(u, zero_offset=offset)
    assert t["qweight"].shape == (256 * bits // 32, 32) and t["g_idx"].shape == (256,)
    back = unpack_gptq(
        t["qweight"], t["qzeros"], t["scales"], t["g_idx"], (32, 256), zero_offset=offset
    )
    assert torch.equal(dense_of(back), dense_of(u))


def test_gptq_symmetric_zero_points_drop_to_the_midpoint():
    u = random_unpacked(16, 128, group=128, seed=5)  # symmetric: zero point 8
    t = pack_gptq(u, zero_offset=1)
    assert int(t["qzeros"][0, 0]) == 0x77777777  # 7 per nibble, as AutoGPTQ writes
    back = unpack_gptq(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], (16, 128), zero_offset=1)
    assert back.zeros is None and torch.equal(dense_of(back), dense_of(u))


def _ct_compress(weight: torch.Tensor, bits: int, group: int | None, symmetric: bool):
    from compressed_tensors.compressors import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams

    strategy = "group" if group else "channel"
    args = QuantizationArgs(
        num_bits=bits, type="int", symmetric=symmetric, strategy=strategy, group_size=group
    )
    cols = weight.shape[1]
    g = group or cols
    view = weight.reshape(weight.shape[0], cols // g, g)
    scale, zp = calculate_qparams(view.amin(-1), view.amax(-1), args)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    state = {"weight": weight, "weight_scale": scale, "weight_zero_point": zp}
    return PackedQuantizationCompressor.compress(state, scheme), scheme


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("group", [64, None])
@pytest.mark.parametrize("symmetric", [True, False])
def test_compressed_tensors_equals_the_packages_decompression(bits, group, symmetric):
    pytest.importorskip("compressed_tensors")
    from compressed_tensors.compressors import PackedQuantizationCompressor

    weight = torch.randn(
        48, 256, generator=torch.Generator().manual_seed(bits), dtype=torch.float32
    ).to(torch.bfloat16)
    packed, scheme = _ct_compress(weight, bits, group, symmetric)
    expected = PackedQuantizationCompressor.decompress(dict(packed), scheme)["weight"]
    ours = unpack_compressed(
        packed["weight_packed"],
        packed["weight_scale"],
        packed.get("weight_zero_point"),
        None,
        tuple(packed["weight_shape"].tolist()),
    )
    assert (ours.zeros is None) == symmetric or not symmetric
    assert ours.bits == bits
    # the package dequantizes in the scale's dtype; the plugin keeps float32 until the end
    torch.testing.assert_close(dense_of(ours).to(expected.dtype), expected, rtol=0, atol=0)


def test_marlin_round_trip_and_tile_order():
    u = random_unpacked(128, 256, group=128, seed=7)
    t = pack_marlin(u)
    assert t["B"].shape == (256 // 16, 2 * 128) and t["s"].shape == (2, 128)
    back = unpack_marlin(t["B"], t["s"], (128, 256))
    assert torch.equal(back.codes, u.codes) and torch.equal(back.scales, u.scales)
    perm, scale_perm, single = marlin_permutations()
    assert sorted(perm) == list(range(1024)) and sorted(scale_perm) == list(range(64))
    assert sorted(single) == list(range(32))
    # lane 0's first word: of the first 16 x 16 tile (index 16 k + n), (k, n) = (0, 0),
    # (8, 0), (0, 8), (8, 8) in nibbles 0..3 and (1, 0), (9, 0), (1, 8), (9, 8) in nibbles
    # 4..7: the pairs of its mma.m16n8k16 fragment, even elements in the low nibbles
    assert perm[:8] == (0, 128, 8, 136, 16, 144, 24, 152)
    per_channel = random_unpacked(64, 128, group=-1, seed=8)
    t = pack_marlin(per_channel)
    back = unpack_marlin(t["B"], t["s"], (64, 128))
    assert torch.equal(back.scales, per_channel.scales)


def test_bad_tensors_are_refused_naming_them():
    u = random_unpacked(32, 256, seed=1)
    t = pack_gptq(u, zero_offset=1)
    with pytest.raises(ValueError, match="qweight"):
        unpack_gptq(t["qweight"][:5], t["qzeros"], t["scales"], None, (32, 256), zero_offset=1)
    with pytest.raises(ValueError, match="3-bit|not supported"):
        unpack_gptq(t["qweight"][:24], t["qzeros"], t["scales"], None, (32, 256), zero_offset=1)
    with pytest.raises(ValueError, match="weight_packed"):
        unpack_compressed(torch.zeros(32, 5, dtype=torch.int32), u.scales, None, None, (32, 256))
