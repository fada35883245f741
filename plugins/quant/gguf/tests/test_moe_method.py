"""The GGUF MoEMethod on the CPU (the torch reference path): tensor-parallel ranks of quantized
experts add up to the whole layer, shards that cut blocks are refused by name, and a layer
whose experts were never loaded says which."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quant_blocks import random_blocks
from tallow.layers import BuildContext, FusedExperts, QuantizedWeight
from tallow_quant_gguf.qtypes import QUANT_TYPES
from tallow_quant_gguf.scheme import GGUFQuantScheme

E, H = 4, 256


def stacked(qtype: str, experts: int, rows: int, cols: int, seed: int) -> QuantizedWeight:
    import gguf

    raw = random_blocks(
        qtype,
        experts * rows,
        cols // QUANT_TYPES[qtype].block,
        seed=seed,
        extremes=False,
        d_range=(1e-3, 1e-2),
    ).reshape(experts, rows, -1)

    def dequantize(data: torch.Tensor, qt: str, shape: tuple[int, ...]) -> torch.Tensor:
        values = gguf.quants.dequantize(
            data.numpy().reshape(-1, data.shape[-1]), gguf.GGMLQuantizationType[qt]
        )
        return torch.from_numpy(np.ascontiguousarray(values)).reshape(shape)

    return QuantizedWeight("gguf", qtype, (experts, rows, cols), torch.from_numpy(raw), dequantize)


def experts(inter: int, rank: int = 0, tp: int = 1) -> FusedExperts:
    return FusedExperts(
        E,
        H,
        inter,
        bias=False,
        activation="silu",
        swiglu_alpha=1.702,
        swiglu_limit=7.0,
        prefix="mlp.experts",
        build=BuildContext(quant=GGUFQuantScheme(None), tp_rank=rank, tp_size=tp),
    )


def load(layer: FusedExperts, w13: QuantizedWeight, w2: QuantizedWeight) -> FusedExperts:
    layer.w13_weight.weight_loader(layer.w13_weight, w13)
    layer.w2_weight.weight_loader(layer.w2_weight, w2)
    layer.quant_method.process_weights_after_loading(layer)
    return layer


def test_tensor_parallel_ranks_of_quantized_experts_sum_to_the_whole():
    inter = 512  # two ranks of 256: whole Q6_K blocks of the down projection
    w13, w2 = stacked("Q4_K", E, 2 * inter, H, 1), stacked("Q6_K", E, H, inter, 2)
    whole = load(experts(inter), w13, w2)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, H, generator=g)
    weights, ids = torch.randn(5, E, generator=g).softmax(-1).topk(2, dim=-1)
    parts = [load(experts(inter, rank, 2), w13, w2)(x, weights, ids) for rank in range(2)]
    assert parts[0].shape == (5, H)
    assert {k: p.rows for k, p in whole.quant_method.stacked.items()} == {
        "w13": E * 2 * inter,
        "w2": E * H,
    }
    expected = whole(x, weights, ids)
    # float32 sums split differently: a small fraction of the output's scale
    err = float((parts[0] + parts[1] - expected).abs().max())
    assert err <= 1e-5 * float(expected.abs().max()), err


def test_a_shard_that_cuts_blocks_is_refused():
    inter = 256  # two ranks of 128 columns: half a Q6_K block each
    layer = experts(inter, 0, 2)
    with pytest.raises(
        ValueError,
        match=r"expert 0: this rank's columns 0:128 do not fall on "
        r"256-element block boundaries of Q6_K",
    ):
        layer.w2_weight.weight_loader(layer.w2_weight, stacked("Q6_K", E, H, inter, 3))


def test_missing_experts_are_named():
    layer = experts(256)
    part = stacked("Q4_K", E, 256, H, 4)
    layer.w13_weight.weight_loader(layer.w13_weight, part.select(1), ("1", "gate"))
    with pytest.raises(ValueError, match=r"the gate weight of expert\(s\) \[0, 2, 3\]"):
        layer.quant_method.process_weights_after_loading(layer)
