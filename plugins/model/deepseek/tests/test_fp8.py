"""A block-fp8 DeepSeek-V3 checkpoint (the format DeepSeek-V3/R1 ship: every projection and
expert ``float8_e4m3fn`` with a float32 ``weight_scale_inv`` per 128 x 128 block, the router
and norms in float) loads through tallow-quant-fp8 and runs on the CPU; the oracle is
transformers on the same model with the weights dequantized. The latent projection
``kv_a_proj_with_mqa`` has 192 output rows: one whole block and a partial one, as the real
model's 576 rows (the scheme keeps such a layer dense, dequantized)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the oracle")
pytest.importorskip("tallow_quant_fp8", reason="tallow-quant-fp8 loads the checkpoint")

from tallow.plugin.testing import save_tokenizer  # noqa: E402
from tallow.plugin.testing.engine import offline_llm  # noqa: E402
from tallow.plugin.testing.model_parity import assert_greedy_parity, random_hf_model  # noqa: E402

FP8 = torch.float8_e4m3fn
PROMPT = [3, 17, 250, 9, 64, 101, 7, 44, 45, 200, 12]  # at most 16 rows: weight-only linears
STEPS = 8
I = 128  # expert intermediate size


def tiny_config():
    return transformers.DeepseekV3Config(
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=I,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        q_lora_rank=128,
        kv_lora_rank=128,
        qk_nope_head_dim=64,
        qk_rope_head_dim=64,
        v_head_dim=64,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=2,
        topk_group=1,
        n_shared_experts=1,
        first_k_dense_replace=1,
        vocab_size=320,
        rms_norm_eps=1e-5,
        max_position_embeddings=256,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )


def quantize_blocks(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(e4m3, ``weight_scale_inv`` [ceil(N/128), ceil(K/128)], the dequantized weight)."""
    w = w.float()
    n, k = w.shape
    rows, cols = -(-n // 128), -(-k // 128)
    padded = torch.zeros(rows * 128, cols * 128)
    padded[:n, :k] = w
    blocks = padded.reshape(rows, 128, cols, 128)
    scale = (blocks.abs().amax(dim=(1, 3)) / 448.0).clamp(min=1e-12)
    q = (blocks / scale[:, None, :, None]).clamp(-448, 448).reshape(rows * 128, cols * 128)
    q = q[:n, :k].to(FP8)
    expanded = scale.repeat_interleave(128, 0).repeat_interleave(128, 1)[:n, :k]
    return q, scale, q.float() * expanded


def _quantized(name: str, value: torch.Tensor) -> bool:
    return (
        value.dim() == 2
        and name.endswith("proj.weight")
        and "embed" not in name
        and not name.startswith("lm_head")
    )


def write_checkpoint(hf, out: Path):
    """``hf`` saved in DeepSeek's block-fp8 format (per-expert tensors); returns the oracle:
    the same model with every quantized weight dequantized."""
    from safetensors.torch import save_file

    tensors, oracle_state = {}, {}
    for name, value in hf.state_dict().items():
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            prefix = name.rsplit(".", 1)[0]
            deq = torch.empty_like(value, dtype=torch.float32)
            for e in range(value.shape[0]):
                parts = (
                    {"gate_proj": value[e, :I], "up_proj": value[e, I:]}
                    if name.endswith("gate_up_proj")
                    else {"down_proj": value[e]}
                )
                rows = 0
                for part, w in parts.items():
                    q, s, d = quantize_blocks(w)
                    tensors[f"{prefix}.{e}.{part}.weight"] = q.contiguous()
                    tensors[f"{prefix}.{e}.{part}.weight_scale_inv"] = s.contiguous()
                    deq[e, rows : rows + w.shape[0]] = d
                    rows += w.shape[0]
            oracle_state[name] = deq
        elif _quantized(name, value):
            q, s, d = quantize_blocks(value)
            tensors[name] = q.contiguous()
            tensors[name.removesuffix("weight") + "weight_scale_inv"] = s.contiguous()
            oracle_state[name] = d
        else:
            tensors[name] = value.contiguous()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    config = hf.config.to_dict()
    config["architectures"] = ["DeepseekV3ForCausalLM"]
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    }
    (out / "config.json").write_text(json.dumps(config))
    save_tokenizer(out)
    hf.load_state_dict(oracle_state, strict=False)
    return hf


def test_block_fp8_checkpoint_loads_and_matches_the_dequantized_model(tmp_path):
    hf = random_hf_model(tiny_config(), seed=31).float().eval()
    oracle = write_checkpoint(hf, tmp_path / "v3-fp8")
    llm = offline_llm(
        str(tmp_path / "v3-fp8"),
        plugins=["tallow-model-deepseek", "tallow-quant-fp8", "tallow-format-safetensors"],
        config={"model": {"dtype": "float32", "max_model_len": 64}, "cache": {"num_blocks": 32}},
    )
    loaded = llm.engine.parts.loaded
    model = loaded.model
    attn = model.model.layers[1].self_attn
    for name in ("q_a_proj", "q_b_proj", "kv_b_proj", "o_proj"):
        assert getattr(attn, name).qweight.dtype == FP8, name
    # rows that do not fill their last 128-row block: the fp8 scheme keeps the layer dense,
    # dequantized from the checkpoint's blocks
    assert attn.kv_a_proj_with_mqa.dense_weight.dtype == torch.float32
    assert model.model.layers[1].mlp.experts.w13_weight.dtype == FP8
    assert "1 expert layers" in loaded.quant.summary()
    # the absorbed up-projection is kv_b_proj's dequantized weight
    weight = oracle.model.layers[1].self_attn.kv_b_proj.weight.view(2, 128, 128)
    torch.testing.assert_close(attn.attn.w_uk, weight[:, :64], rtol=0, atol=1e-6)
    assert_greedy_parity(model, oracle, PROMPT, STEPS, what="deepseek-v3 block fp8")
