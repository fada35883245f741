"""Packed planes decode to the same bits as ``gguf.quants.dequantize`` of the GGML blocks, for
every type, on random blocks whose scales include extreme values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quant_blocks import random_blocks
from tallow_quant_gguf.packing import PackedWeight, cat_rows, pack
from tallow_quant_gguf.qtypes import QUANT_TYPES, quant_type
from tallow_quant_gguf.reference import dequantize_ref, dequantize_rows_ref

TYPES = sorted(QUANT_TYPES)


def gguf_dequantize(blocks: np.ndarray, qtype: str) -> np.ndarray:
    import gguf

    with np.errstate(all="ignore"):  # inf * 0 and friends in the extreme blocks
        return gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType[qtype])


def assert_same_bits(got: torch.Tensor, expected: np.ndarray, what: str) -> None:
    """Equal bit patterns (so -0.0 != 0.0), except that any NaN matches any NaN."""
    exp = torch.from_numpy(np.ascontiguousarray(expected, dtype=np.float32))
    assert got.dtype == torch.float32 and got.shape == exp.shape, what
    both_nan = torch.isnan(got) & torch.isnan(exp)
    differ = (got.view(torch.int32) != exp.view(torch.int32)) & ~both_nan
    if differ.any():
        i = differ.nonzero()[0].tolist()
        raise AssertionError(
            f"{what}: {int(differ.sum())} values differ, first at {i}: "
            f"{got[tuple(i)].item()!r} != {exp[tuple(i)].item()!r}"
        )


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == torch.float16 else t


def test_type_table_matches_the_gguf_package():
    import gguf

    for name, qt in QUANT_TYPES.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]] == (
            qt.block,
            qt.block_bytes,
        ), name


@pytest.mark.parametrize("qtype", TYPES)
def test_reference_decoding_is_bit_identical_to_gguf(qtype):
    blocks = random_blocks(qtype, rows=12, blocks_per_row=3, seed=hash(qtype) % 1000)
    packed = pack(torch.from_numpy(blocks), qtype)
    qt = quant_type(qtype)
    assert (packed.rows, packed.cols) == (12, 3 * qt.block)
    assert_same_bits(dequantize_ref(packed), gguf_dequantize(blocks, qtype), qtype)


@pytest.mark.parametrize("qtype", TYPES)
def test_ordinary_blocks_decode_to_finite_values(qtype):
    # the extreme-free blocks: no NaN can hide a difference behind "NaN matches NaN"
    blocks = random_blocks(qtype, rows=5, blocks_per_row=2, seed=7, extremes=False)
    got = dequantize_ref(pack(torch.from_numpy(blocks), qtype))
    assert torch.isfinite(got).all()
    assert_same_bits(got, gguf_dequantize(blocks, qtype), qtype)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_0", "Q6_K"])
def test_packing_in_chunks_of_rows_is_the_same(qtype):
    blocks = torch.from_numpy(random_blocks(qtype, rows=9, blocks_per_row=2, seed=3))
    whole = pack(blocks, qtype)
    chunked = pack(blocks, qtype, chunk_rows=4)
    for name, plane in whole.planes.items():
        assert torch.equal(_bits(plane), _bits(chunked.planes[name])), name


def test_planes_cost_the_bytes_of_the_blocks():
    for name, qt in QUANT_TYPES.items():
        blocks = torch.from_numpy(random_blocks(name, rows=4, blocks_per_row=2))
        packed = pack(blocks, name)
        ratio = packed.nbytes / blocks.numel()
        # only the unpacked 6-bit sub-scales and mins of some k-quants cost more
        assert 1.0 <= ratio <= 1.04, (name, ratio)


def test_rows_gather_and_stack():
    blocks = torch.from_numpy(random_blocks("Q4_K", rows=6, blocks_per_row=1, seed=5))
    packed = pack(blocks, "Q4_K")
    full = dequantize_ref(packed)
    ids = torch.tensor([4, 0, 4, 2])
    assert torch.equal(dequantize_rows_ref(packed, ids).nan_to_num(), full[ids].nan_to_num())
    halves = cat_rows([pack(blocks[:2], "Q4_K"), pack(blocks[2:], "Q4_K")])
    assert torch.equal(dequantize_ref(halves).nan_to_num(), full.nan_to_num())
    padded = packed.pad_rows(3)
    assert padded.rows == 9 and torch.count_nonzero(dequantize_ref(padded)[6:]) == 0


def test_bad_blocks_are_refused_clearly():
    with pytest.raises(ValueError, match="not a whole number of 144-byte blocks"):
        pack(torch.zeros(2, 100, dtype=torch.uint8), "Q4_K")
    with pytest.raises(ValueError, match="expected 512"):
        pack(torch.zeros(2, 144, dtype=torch.uint8), "Q4_K", cols=512)
    with pytest.raises(ValueError, match="not kept quantized"):
        quant_type("TQ1_0")
    assert isinstance(pack(torch.zeros(1, 18, dtype=torch.uint8), "q4_0"), PackedWeight)
