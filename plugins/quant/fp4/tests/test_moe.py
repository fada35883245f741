"""MXFP4 experts (gpt-oss's ``*_blocks`` / ``*_scales``): the layout against transformers' own
dequantization, the quantizer, and the MoE method in :class:`tallow.layers.FusedMoE` (loading,
tensor-parallel shares, the result against float experts of the decoded weights)."""

from __future__ import annotations

import pytest
import torch

from tallow.layers import BuildContext, FusedMoE, RouterSpec
from tallow_quant_fp4.isq import mxfp4_codes, quantize_mxfp4
from tallow_quant_fp4.layout import dequantize
from tallow_quant_fp4.moe import MXFP4MoEMethod
from tallow_quant_fp4.moe_ops import dequantize_experts, pack_blocks
from tallow_quant_fp4.scheme import FP4QuantScheme

E, H, I = 4, 64, 96


def _random_blocks(shape: tuple[int, ...], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (*shape[:-1], shape[-1] // 32, 16), generator=gen)
    scales = torch.randint(118, 130, (*shape[:-1], shape[-1] // 32), generator=gen)
    return blocks.to(torch.uint8), scales.to(torch.uint8)


def test_layout_is_transformers_gpt_oss_layout():
    """transformers' ``_convert_moe_packed_tensors`` (what GptOss runs on an MXFP4 checkpoint)
    decodes the same blocks to the transpose of ours: ``[E, cols, rows]``."""
    mxfp4 = pytest.importorskip(
        "transformers.integrations.mxfp4", reason="transformers is the oracle of the layout"
    )
    blocks, scales = _random_blocks((E, 2 * I, H), seed=0)
    ref = mxfp4._convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
    assert torch.equal(dequantize_experts(blocks, scales), ref.transpose(1, 2))


def test_quantizer_packs_what_it_decodes():
    """The OCP quantizer's codes packed as checkpoint blocks decode to its rounding of the
    weights: within half of e2m1's widest step (4 to 6) times the block's scale, or, where a
    block's largest value saturates at 6, within twice the scale."""
    w = torch.randn(E, 2 * I, H, generator=torch.Generator().manual_seed(1)) * 0.05
    codes, scales = mxfp4_codes(w)
    blocks = pack_blocks(codes)
    assert blocks.shape == (E, 2 * I, H // 32, 16) and scales.shape == (E, 2 * I, H // 32)
    back = dequantize_experts(blocks, scales)
    scale = torch.exp2((scales.int() - 127).float()).repeat_interleave(32, -1)
    assert bool(((back - w).abs() <= 2 * scale + 1e-12).all())
    # the same rounding as load-time quantization of a dense layer (--isq mxfp4)
    dense = dequantize(quantize_mxfp4(w.reshape(-1, H), torch.device("cpu")))
    assert torch.equal(back.reshape(-1, H), dense)


class _Scheme(FP4QuantScheme):
    """The fp4 scheme as an ``mxfp4`` checkpoint configures it."""

    def __init__(self) -> None:
        super().__init__()
        self.use_checkpoint_config({"quantization_config": {"quant_method": "mxfp4"}})


def _layers(tp_size: int = 1, tp_rank: int = 0) -> tuple[FusedMoE, FusedMoE]:
    kw = dict(
        router=RouterSpec(top_k=2, scoring="softmax_selected"),
        router_bias=True,
        activation="swiglu_clamp",
        expert_bias=True,
        prefix="mlp",
    )
    quant = FusedMoE(
        E, H, I, build=BuildContext(quant=_Scheme(), tp_size=tp_size, tp_rank=tp_rank), **kw
    )
    dense = FusedMoE(E, H, I, build=BuildContext(tp_size=tp_size, tp_rank=tp_rank), **kw)
    return quant, dense


def _checkpoint(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    b13, s13 = _random_blocks((E, 2 * I, H), seed)
    b2, s2 = _random_blocks((E, H, I), seed + 1)
    return {
        "w13_blocks": b13,
        "w13_scales": s13,
        "w2_blocks": b2,
        "w2_scales": s2,
        "w13_bias": torch.randn(E, 2 * I, generator=gen),
        "w2_bias": torch.randn(E, H, generator=gen),
        "gate.weight": torch.randn(E, H, generator=gen),
        "gate.bias": torch.randn(E, generator=gen),
    }


def _load(layer: FusedMoE, tensors: dict[str, torch.Tensor]) -> None:
    params = dict(layer.named_parameters())
    for name, t in tensors.items():
        target = name if name.startswith("gate") else f"experts.{name}"
        param = params[target]
        getattr(param, "weight_loader", lambda p, x: p.data.copy_(x))(param, t)
    for module in layer.modules():
        method = getattr(module, "quant_method", None)
        if method is not None:
            method.process_weights_after_loading(module)


def test_moe_method_runs_the_decoded_experts():
    """A FusedMoE whose scheme keeps the experts MXFP4 gives what float experts of the decoded
    weights give (the torch path here; the kernels are checked in kernel_cases.py)."""
    quant, dense = _layers()
    assert isinstance(quant.experts.quant_method, MXFP4MoEMethod)
    assert quant.experts.w13_blocks.dtype == torch.uint8
    ckpt = _checkpoint(2)
    _load(quant, ckpt)
    floats = {k: v for k, v in ckpt.items() if "blocks" not in k and "scales" not in k}
    floats["w13_weight"] = dequantize_experts(ckpt["w13_blocks"], ckpt["w13_scales"])
    floats["w2_weight"] = dequantize_experts(ckpt["w2_blocks"], ckpt["w2_scales"])
    _load(dense, floats)
    x = torch.randn(9, H, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(quant(x), dense(x), rtol=1e-5, atol=1e-5)


def test_tensor_parallel_share():
    """Rank 1 of 3 keeps its 32 features of the gate half, of the up half, and its 32-column
    block of every down row."""
    quant, _ = _layers(tp_size=3, tp_rank=1)
    ckpt = _checkpoint(4)
    _load(quant, {k: v for k, v in ckpt.items() if "bias" not in k})
    ex = quant.experts
    assert torch.equal(ex.w13_blocks[:, :32], ckpt["w13_blocks"][:, 32:64])
    assert torch.equal(ex.w13_blocks[:, 32:], ckpt["w13_blocks"][:, I + 32 : I + 64])
    assert torch.equal(ex.w2_scales, ckpt["w2_scales"][:, :, 1:2])
    assert torch.equal(ex.w2_blocks, ckpt["w2_blocks"][:, :, 1:2])


def test_bad_tensors_are_refused_with_their_name():
    quant, _ = _layers()
    param = quant.experts.w13_blocks
    with pytest.raises(ValueError, match="w13_blocks.*expected"):
        param.weight_loader(param, torch.zeros(E, 2 * I, H // 32, 8, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        param.weight_loader(param, torch.zeros(E, 2 * I, H // 32, 16))
    with pytest.raises(ValueError, match="multiples of 32"):
        FusedMoE(E, 48, I, router=RouterSpec(top_k=2), build=BuildContext(quant=_Scheme()))


def test_only_mxfp4_checkpoints_get_packed_experts():
    scheme = FP4QuantScheme()
    assert scheme.moe_method("mlp.experts") is None  # no checkpoint config: float experts
    scheme.use_checkpoint_config(
        {
            "quantization_config": {
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "g": {
                        "format": "nvfp4-pack-quantized",
                        "weights": {"type": "float", "num_bits": 4, "group_size": 16},
                    }
                },
            }
        }
    )
    assert scheme.moe_method("mlp.experts") is None
    assert isinstance(_Scheme().moe_method("mlp.experts"), MXFP4MoEMethod)
