"""FP4 weights for the tests: random codes and scales in each checkpoint format, their float
values by the format's definition, and tiny random Llama checkpoints written with them."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tallow_quant_fp4.layout import E2M1_VALUES

LINEARS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
VOCAB = 320


def random_fp4(rows: int, cols: int, kind: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random e2m1 codes, as a checkpoint of ``kind`` stores them: ``mxfp4`` (gpt-oss:
    ``weight_blocks``, ``weight_scales``), ``ct-mxfp4`` or ``nvfp4`` (compressed-tensors:
    ``weight_packed``, ``weight_scale``, ``weight_global_scale``)."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 16, (rows, cols), generator=gen, dtype=torch.uint8)
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    if kind == "nvfp4":
        local = (0.05 + torch.rand(rows, cols // 16, generator=gen)).to(torch.float8_e4m3fn)
        return {
            "weight_packed": packed,
            "weight_scale": local,
            "weight_global_scale": torch.tensor([40.0]),
        }
    exponents = torch.randint(119, 124, (rows, cols // 32), generator=gen, dtype=torch.uint8)
    if kind == "ct-mxfp4":
        return {"weight_packed": packed, "weight_scale": exponents}
    return {"weight_blocks": packed.reshape(rows, cols // 32, 16), "weight_scales": exponents}


def dense_of(t: dict[str, torch.Tensor]) -> torch.Tensor:
    """The float32 weight, by the formats' definition: e2m1 value times the group's scale."""
    packed = t["weight_blocks"].flatten(1) if "weight_blocks" in t else t["weight_packed"]
    codes = torch.stack([packed & 15, packed >> 4], dim=-1).flatten(1)
    values = torch.tensor(E2M1_VALUES)[codes.long()]
    if "weight_global_scale" in t:
        scale = t["weight_scale"].float() / t["weight_global_scale"].float()
    else:
        e = t.get("weight_scales", t.get("weight_scale"))
        scale = torch.exp2(e.float() - 127)
    group = codes.shape[1] // scale.shape[1]
    return values * scale.repeat_interleave(group, dim=1)


CONFIGS = {
    "mxfp4": {"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]},
    "ct-mxfp4": {
        "quant_method": "compressed-tensors",
        "format": "mxfp4-pack-quantized",
        "quantization_status": "compressed",
        "ignore": ["lm_head"],
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "input_activations": None,
                "weights": {
                    "num_bits": 4,
                    "type": "float",
                    "symmetric": True,
                    "strategy": "group",
                    "group_size": 32,
                    "dynamic": False,
                },
            }
        },
    },
    "nvfp4": {
        "quant_method": "compressed-tensors",
        "format": "nvfp4-pack-quantized",
        "quantization_status": "compressed",
        "ignore": ["lm_head"],
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "input_activations": {
                    "num_bits": 4,
                    "type": "float",
                    "strategy": "tensor_group",
                    "group_size": 16,
                    "dynamic": "local",
                },
                "weights": {
                    "num_bits": 4,
                    "type": "float",
                    "symmetric": True,
                    "strategy": "tensor_group",
                    "group_size": 16,
                    "dynamic": False,
                },
            }
        },
    },
}


def write_checkpoint(root: Path, kind: str, seed: int = 0):
    """A tiny random Llama whose linear layers are random FP4 weights of ``kind``, and the
    float32 transformers model of their values."""
    import transformers
    from safetensors.torch import save_file

    from tallow.engine.random_model import synthetic_tokenizer

    config = transformers.LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).float().eval()
    tensors, values = {}, {}
    for i, (name, param) in enumerate(model.state_dict().items()):
        stem = name.rsplit(".", 1)[0]
        if any(stem.endswith(lin) for lin in LINEARS):
            t = random_fp4(*param.shape, kind, seed=i)
            tensors.update({f"{stem}.{k}": v for k, v in t.items()})
            values[name] = dense_of(t)
        else:
            tensors[name] = param.to(torch.float16).contiguous()
            values[name] = param.to(torch.float16).float()
    model.load_state_dict(values)
    out = root / kind
    out.mkdir(parents=True)
    save_file(
        {k: v.contiguous() for k, v in tensors.items()},
        str(out / "model.safetensors"),
        metadata={"format": "pt"},
    )
    data = config.to_dict()
    data.update(
        architectures=["LlamaForCausalLM"], torch_dtype="float16", quantization_config=CONFIGS[kind]
    )
    (out / "config.json").write_text(json.dumps(data))
    synthetic_tokenizer(VOCAB).save(str(out / "tokenizer.json"))
    return out, model
