"""The packed GEMM's layout and its CPU path (no Triton): packing, the checks of its tensors
and tiles, the decoding against a hand-computed weight, and the tile table."""

from __future__ import annotations

import pytest
import torch

from tallow.kernels import (
    PACKED_GEMM_TUNED,
    PackedGemmConfig,
    PackedGemmWeight,
    dequantize_packed_ref,
    packed_gemm,
    packed_gemm_config,
    packed_weight,
)
from tallow.kernels.packed_gemm import check_config, pack_u4, unpack_u4


def test_u4_words_hold_k_in_order():
    codes = torch.randint(0, 16, (5, 24), generator=torch.Generator().manual_seed(1))
    words = pack_u4(codes)
    assert words.dtype == torch.int32 and words.shape == (3, 5)
    # row k's code sits at bits 4 (k % 8) of word k // 8, column n
    for k in (0, 7, 9, 23):
        assert int(words[k // 8, 2].item() >> (4 * (k % 8)) & 15) == int(codes[2, k])
    assert torch.equal(unpack_u4(words), codes.to(torch.uint8))


def test_decoding_by_hand():
    codes = torch.tensor([[3, 15, 0, 8, 1, 2, 3, 4]])
    scales = torch.tensor([[0.5, 2.0]], dtype=torch.float16)
    zeros = torch.tensor([[8, 1]])
    mins = torch.tensor([[0.25, -1.0]])
    w = packed_weight("u4", codes, scales, group=4, zeros=zeros, mins=mins)
    want = torch.tensor(
        [[(3 - 8) * 0.5 - 0.25, (15 - 8) * 0.5 - 0.25, -4.25, -0.25, 1.0, 3.0, 5.0, 7.0]]
    )
    assert torch.equal(dequantize_packed_ref(w), want)


def test_cpu_product_is_the_reference():
    g = torch.Generator().manual_seed(2)
    w = packed_weight(
        "u8",
        torch.randint(0, 256, (6, 32), generator=g),
        torch.rand(6, 1, generator=g),
        group=32,
        zero_point=128,
    )
    x = torch.randn(3, 2, 32, generator=g)
    y = packed_gemm(x, w)
    assert y.shape == (3, 2, 6)
    torch.testing.assert_close(y, x @ dequantize_packed_ref(w).T)


@pytest.mark.parametrize(
    "bad,message",
    [
        (dict(codes=torch.zeros(4, 4, dtype=torch.int64)), "codes must be contiguous"),
        (dict(scales=torch.zeros(1, 4, dtype=torch.int32)), "scales must be"),
        (dict(zeros=torch.zeros(2, 4, dtype=torch.uint8)), "zeros must be"),
        (dict(kind="u3"), "kind must be one of"),
        (dict(group=0), "must be positive"),
    ],
)
def test_bad_tensors_are_named(bad, message):
    fields = dict(
        kind="u4",
        rows=4,
        cols=32,
        group=32,
        codes=torch.zeros(4, 4, dtype=torch.int32),
        scales=torch.ones(1, 4, dtype=torch.float16),
    )
    fields.update(bad)
    with pytest.raises(ValueError, match=message):
        PackedGemmWeight(**fields)


def test_wrong_input_width_is_refused():
    w = packed_weight("u8", torch.zeros(2, 32, dtype=torch.uint8), torch.ones(2, 1), group=32)
    with pytest.raises(ValueError, match="x has 16 input features"):
        packed_gemm(torch.zeros(1, 16), w)


def test_tiles_must_not_straddle_groups():
    w = packed_weight("u8", torch.zeros(2, 192, dtype=torch.uint8), torch.ones(2, 2), group=96)
    with pytest.raises(ValueError, match="block_k 64 and the weight's group 96"):
        check_config(w, PackedGemmConfig(16, 16, 64))
    with pytest.raises(ValueError, match="power of two"):
        PackedGemmConfig(16, 24, 64)


def test_tuned_table_from_json(tmp_path, monkeypatch):
    monkeypatch.setattr("tallow.kernels.packed_layout.TUNED_CONFIGS", {})
    from tallow.kernels import packed_layout

    path = tmp_path / "table.json"
    path.write_text('{"u8,16,4096,4096": [16, 128, 64, 4, 4, 3]}')
    assert packed_layout.load_tuned_configs(str(path)) == 1
    assert packed_layout.packed_gemm_config(9, 4096, 4096, "u8") == PackedGemmConfig(
        16, 128, 64, 4, 4, 3
    )
    path.write_text('{"q4,16,4096,4096": [16, 128, 64, 4, 4, 3]}')
    with pytest.raises(ValueError, match="names no packed kind"):
        packed_layout.load_tuned_configs(str(path))


def test_config_table_then_rule(monkeypatch):
    small = packed_gemm_config(1, 4096, 4096, "u4")
    assert small.block_m == 16 and small.split_k > 1
    assert packed_gemm_config(512, 4096, 4096, "u4").split_k == 1
    tuned = PackedGemmConfig(16, 128, 128, 4, num_warps=8)
    monkeypatch.setitem(PACKED_GEMM_TUNED, ("u4", 16, 4096, 4096), tuned)
    assert packed_gemm_config(9, 4096, 4096, "u4") is tuned
    assert packed_gemm_config(1, 4096, 4096, "u4") == small
