"""Qwen3-Next as its published fp8 checkpoints store it (Qwen3-Next-80B-A3B-Instruct-FP8: the
HF ``fp8`` format, ``weight_block_size: [128, 128]``, e4m3 weights with float32
``weight_scale_inv`` per 128 x 128 block; the router, the shared expert's gate and the linear
attention's ``in_proj_ba``, ``conv1d``, ``A_log``, ``dt_bias`` and norm left in float, as Qwen's
``modules_to_not_convert`` lists them), served by the engine through tallow-quant-fp8: the
weights stay e4m3 and the model equals transformers run on the dequantized weights. The
checkpoint's ``in_proj_qkvz`` interleaves q, k, v and z per key head; loading reorders its rows
and, with them, the rows of its block scales."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")
pytest.importorskip("tallow_quant_fp8", reason="tallow-quant-fp8 serves fp8 checkpoints")
pytest.importorskip("tallow_format_safetensors", reason="reads the checkpoint")

from tallow.config import config_from_mapping  # noqa: E402
from tallow.engine.llm_engine import LLMEngine  # noqa: E402
from tallow.plugin.testing import save_tokenizer  # noqa: E402
from tallow.plugin.testing.model_parity import assert_greedy_parity, random_hf_model  # noqa: E402
from tallow.plugin.testing.seeds import seed_of  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from tiny_config import TINY  # noqa: E402

FP8 = torch.float8_e4m3fn
BLOCK = 128
#: at most 16 rows per step: the fp8 linears run weight-only, so the dequantized weights in
#: float32 are the whole oracle (more rows would quantize the activations too)
PROMPT = [3, 17, 50, 9, 64, 101, 7, 44, 45, 120, 12]
STEPS = 8
#: every projection a whole number of 128 x 128 blocks, and every per-key-head part of
#: in_proj_qkvz (q, k: 128 rows; v, z: 2 x 128) whole blocks too, as in Qwen3-Next-80B-A3B
SIZES = dict(
    hidden_size=128,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=128,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    moe_intermediate_size=128,
    shared_expert_intermediate_size=128,
    mlp_only_layers=[],
)
#: Qwen's modules_to_not_convert (besides the embedding and the head)
FLOAT = (
    "linear_attn.in_proj_ba.",
    "mlp.gate.weight",
    "shared_expert_gate.",
)


def _block_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(e4m3, weight_scale_inv [N/128, K/128], the dequantized float32 weight) of ``w``."""
    n, k = w.shape
    blocks = w.float().reshape(n // BLOCK, BLOCK, k // BLOCK, BLOCK)
    scale = (blocks.abs().amax(dim=(1, 3)) / 448.0).clamp(min=1e-12)
    q = (blocks / scale[:, None, :, None]).clamp(-448, 448).reshape(n, k).to(FP8)
    expanded = scale.repeat_interleave(BLOCK, 0).repeat_interleave(BLOCK, 1)
    return q, scale, q.float() * expanded


def _quantized(name: str, value: torch.Tensor) -> bool:
    return (
        name.startswith("model.layers.")
        and name.endswith((".weight", "gate_up_proj", "down_proj"))
        and value.dim() >= 2
        and ".conv1d." not in name
        and not any(part in name for part in FLOAT)
    )


def write_fp8_checkpoint(hf: Any, out: Path) -> Any:
    """Save ``hf`` in the HF block-wise fp8 format (experts per expert, as the published
    checkpoint); returns transformers' model on the dequantized weights."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    oracle: dict[str, torch.Tensor] = {}
    for name, value in hf.state_dict().items():
        if not _quantized(name, value):
            tensors[name] = value.contiguous()
            continue
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            prefix, stacked = name.rsplit(".", 1)
            half = value.shape[1] // 2
            deq = torch.empty_like(value, dtype=torch.float32)
            for e in range(value.shape[0]):
                parts = (
                    [("gate_proj", 0, half), ("up_proj", half, 2 * half)]
                    if stacked == "gate_up_proj"
                    else [("down_proj", 0, value.shape[1])]
                )
                for part, r0, r1 in parts:
                    q, s, d = _block_quantize(value[e, r0:r1])
                    tensors[f"{prefix}.{e}.{part}.weight"] = q
                    tensors[f"{prefix}.{e}.{part}.weight_scale_inv"] = s
                    deq[e, r0:r1] = d
            oracle[name] = deq
            continue
        q, s, d = _block_quantize(value)
        layer = name[: -len(".weight")]
        tensors[name] = q
        tensors[f"{layer}.weight_scale_inv"] = s
        oracle[name] = d
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    config = hf.config.to_dict()
    config["architectures"] = ["Qwen3NextForCausalLM"]
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [BLOCK, BLOCK],
    }
    (out / "config.json").write_text(json.dumps(config))
    save_tokenizer(out)
    hf.load_state_dict(oracle, strict=False)
    return hf


def test_block_fp8_checkpoint_stays_fp8_and_equals_the_dequantized_model(tmp_path):
    hf = random_hf_model(
        transformers.Qwen3NextConfig(**{**TINY, **SIZES}), seed=seed_of("qwen3-next-fp8")
    )
    oracle = write_fp8_checkpoint(hf, tmp_path / "fp8")
    eng = LLMEngine.from_config(
        config_from_mapping(
            {
                "model": {
                    "source": str(tmp_path / "fp8"),
                    "device": "cpu",
                    "dtype": "float32",
                    "max_model_len": 64,
                },
                "cache": {"num_blocks": 32},
            }
        )
    )
    model = eng.parts.loaded.model
    linear = model.model.layers[0].linear_attn
    for layer in (linear.in_proj_qkvz, linear.out_proj, model.model.layers[2].self_attn.q_proj):
        assert layer.quant_method.weight is not None and layer.quant_method.weight.block
        assert layer.quant_method.weight.data.dtype == FP8
    assert linear.in_proj_ba.quant_method.weight is None  # left in float by the checkpoint
    assert model.model.layers[0].mlp.experts.w13_weight.dtype == FP8
    assert_greedy_parity(model, oracle, PROMPT, STEPS, what="qwen3-next block fp8")


def test_scales_follow_the_reordered_rows_or_are_refused():
    """Per-row scales move with their rows; block scales move by whole blocks; blocks that a
    key head's parts would split are refused, naming the tensor."""
    from tallow.layers import ArchConfig, BuildContext
    from tallow_model_qwen3_next.gated_deltanet import GatedDeltaNet

    def layer(**sizes: int) -> GatedDeltaNet:
        return GatedDeltaNet(ArchConfig({**TINY, **sizes}), BuildContext(), "linear_attn")

    gdn = layer(**{k: v for k, v in SIZES.items() if k.startswith("linear_")})
    rows = 2 * gdn.key_dim + 2 * gdn.value_dim
    per_row = torch.arange(rows, dtype=torch.float32)[:, None]
    assert torch.equal(gdn.scale_rows(per_row, rows, "t", gdn.qkvz_rows), gdn.qkvz_rows(per_row))
    one = torch.tensor(0.5)
    assert gdn.scale_rows(one, rows, "t", gdn.qkvz_rows) is one
    blocks = torch.arange(rows // BLOCK * 2, dtype=torch.float32).reshape(-1, 2)
    moved = gdn.scale_rows(blocks, rows, "t", gdn.qkvz_rows)
    expanded = blocks.repeat_interleave(BLOCK, 0)
    assert torch.equal(moved.repeat_interleave(BLOCK, 0), gdn.qkvz_rows(expanded))
    assert not torch.equal(moved, blocks)  # two key heads: the blocks do move
    # q and k of a key head (64 rows each) share a 128-row block
    small = layer(linear_key_head_dim=64, linear_value_head_dim=64)
    rows = 2 * small.key_dim + 2 * small.value_dim
    with pytest.raises(ValueError, match="layer 0 in_proj_qkvz.weight_scale_inv: block-wise"):
        small.scale_rows(
            torch.rand(-(-rows // BLOCK), 1),
            rows,
            "layer 0 in_proj_qkvz.weight_scale_inv",
            small.qkvz_rows,
        )
