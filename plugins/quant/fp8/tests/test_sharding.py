"""Checkpoint pieces (e4m3 weight, its scale, a static input scale) land on each tensor-parallel
rank as that rank's rows and columns of the whole layer: per-tensor scales repeated over their
partition's rows, per-channel scales sliced with the rows, 128 x 128 block scales sliced on
block boundaries; static input scales of a merged layer become their maximum."""

from __future__ import annotations

import pytest
import torch

from tallow.layers import BuildContext, MergedColumnParallelLinear, RowParallelLinear
from tallow_quant_fp8.formats import Fp8Config
from tallow_quant_fp8.scheme import Fp8QuantScheme
from tallow_quant_fp8.weights import BLOCK, FP8

ROWS, COLS = 256, 512


def scheme(weights: str, activations: str, dialect: str = "compressed-tensors"):
    s = Fp8QuantScheme()
    s.checkpoint = Fp8Config(weights, activations, dialect)
    return s


def checkpoint_piece(kind: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(ROWS, COLS, generator=g) * 50).clamp(-448, 448).to(FP8)
    shape = {"tensor": (1,), "channel": (ROWS, 1), "block": (ROWS // BLOCK, COLS // BLOCK)}[kind]
    return q, torch.rand(shape, generator=g) + 0.01


def load(layer, pieces: dict, shard=None) -> None:
    params = dict(layer.named_parameters(recurse=False))
    for name, tensor in pieces.items():
        param = params[name]
        if shard is None:
            param.weight_loader(param, tensor)
        else:
            param.weight_loader(param, tensor, shard)


def expanded(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The checkpoint's values: ``q`` times its scale of the tensor, row or block."""
    if scale.shape == (ROWS // BLOCK, COLS // BLOCK):
        scale = scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    return q.float() * scale


@pytest.mark.parametrize("kind", ["tensor", "channel", "block"])
def test_row_parallel_ranks_hold_their_columns(kind):
    acts = "group" if kind == "block" else "token"
    q, s = checkpoint_piece(kind, 1)
    full = expanded(q, s)
    for rank in range(2):
        layer = RowParallelLinear(
            COLS, ROWS, build=BuildContext(quant=scheme(kind, acts), tp_rank=rank, tp_size=2)
        )
        load(layer, {"weight": q, "weight_scale": s})
        layer.quant_method.process_weights_after_loading(layer)
        got = layer.quant_method.weight.dequantize()
        half = COLS // 2
        torch.testing.assert_close(got, full[:, rank * half : (rank + 1) * half], rtol=0, atol=0)


@pytest.mark.parametrize(
    "kind,dialect", [("tensor", "fp8"), ("channel", "compressed-tensors"), ("block", "fp8")]
)
def test_merged_column_parallel_ranks_hold_their_rows_of_each_partition(kind, dialect):
    acts = "group" if kind == "block" else ("static" if kind == "tensor" else "token")
    fmt = Fp8Config(kind, acts, dialect)
    pieces = [checkpoint_piece(kind, 10 + i) for i in range(2)]
    statics = [torch.tensor(0.5), torch.tensor(0.75)]
    for rank in range(2):
        layer = MergedColumnParallelLinear(
            COLS,
            [ROWS, ROWS],
            build=BuildContext(quant=scheme(kind, acts, dialect), tp_rank=rank, tp_size=2),
        )
        for shard, (q, s) in enumerate(pieces):
            names = {"weight": q, fmt.scale_name: s}
            if acts == "static":
                names["input_scale"] = statics[shard]
            load(layer, names, shard)
        layer.quant_method.process_weights_after_loading(layer)
        weight = layer.quant_method.weight
        half = ROWS // 2
        expected = torch.cat([expanded(q, s)[rank * half : (rank + 1) * half] for q, s in pieces])
        torch.testing.assert_close(weight.dequantize(), expected, rtol=0, atol=0)
        if acts == "static":
            assert float(weight.input_scale) == 0.75


def test_block_shards_off_block_boundaries_are_refused():
    q, s = checkpoint_piece("block", 3)
    # 4 ranks of a 512-column row-parallel layer: 128 columns each, on block boundaries
    layer = RowParallelLinear(
        COLS, ROWS, build=BuildContext(quant=scheme("block", "group"), tp_rank=1, tp_size=4)
    )
    load(layer, {"weight": q, "weight_scale": s})
    # 8 ranks: 64 columns each, rank 1 starts inside a block
    layer = RowParallelLinear(
        COLS, ROWS, build=BuildContext(quant=scheme("block", "group"), tp_rank=1, tp_size=8)
    )
    with pytest.raises(ValueError, match="block boundaries"):
        load(layer, {"weight": q, "weight_scale": s})


def test_missing_or_misshaped_scales_are_named():
    q, s = checkpoint_piece("channel", 4)
    layer = RowParallelLinear(COLS, ROWS, build=BuildContext(quant=scheme("channel", "token")))
    with pytest.raises(ValueError, match=r"per-channel weight scale must have shape \(256, 1\)"):
        load(layer, {"weight_scale": s[:10]})
    load(layer, {"weight": q})
    with pytest.raises(ValueError, match="float8 but the checkpoint has no weight_scale"):
        layer.quant_method.process_weights_after_loading(layer)
