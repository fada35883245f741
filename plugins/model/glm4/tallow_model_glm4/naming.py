"""How GLM-4 checkpoint tensor names map onto the model's parameters.

The parameters are the Llama family's (:mod:`tallow_model_llama.naming`) plus two norms per layer::

    model.layers.i.post_self_attn_layernorm.weight  [hidden]  on the attention output
    model.layers.i.post_mlp_layernorm.weight        [hidden]  on the MLP output

Hugging Face names are the Llama family's (``mlp.gate_up_proj`` arrives fused and is split on
load) plus those two norms under the same names.

GGUF names (``naming="gguf"``, llama.cpp's ``glm4``; no row permutation: llama.cpp rotates
GLM-4 in the same interleaved layout) → parameter:

    token_embd.weight              → model.embed_tokens.weight
    blk.i.attn_norm.weight         → model.layers.i.input_layernorm.weight
    blk.i.attn_q/k/v.{weight,bias} → model.layers.i.self_attn.qkv_proj.*  shard q/k/v
    blk.i.attn_qkv.{weight,bias}   → model.layers.i.self_attn.qkv_proj.*  (fused q|k|v)
    blk.i.attn_output.weight       → model.layers.i.self_attn.o_proj.weight
    blk.i.post_attention_norm.weight → model.layers.i.post_self_attn_layernorm.weight
    blk.i.ffn_norm.weight          → model.layers.i.post_attention_layernorm.weight
    blk.i.ffn_up.weight            → model.layers.i.mlp.gate_up_proj.weight  (fused gate|up)
    blk.i.ffn_down.weight          → model.layers.i.mlp.down_proj.weight
    blk.i.post_ffw_norm.weight     → model.layers.i.post_mlp_layernorm.weight
    output_norm.weight             → model.norm.weight
    output.weight                  → lm_head.weight  (absent: the head is tied to token_embd)
    rope_freqs.weight              → per-frequency RoPE divisors
"""

from __future__ import annotations

from tallow.layers import WeightNameMap, WeightRule
from tallow_model_llama import naming as llama_naming

_L = "model.layers.{i}"
_B = "blk.{i}"


def hf_name_map() -> WeightNameMap:
    """Hugging Face ``model.safetensors`` names."""
    return llama_naming.hf_name_map() + [
        WeightRule(
            f"{_L}.post_self_attn_layernorm.weight", f"{_L}.post_self_attn_layernorm.weight"
        ),
        WeightRule(f"{_L}.post_mlp_layernorm.weight", f"{_L}.post_mlp_layernorm.weight"),
    ]


def gguf_name_map() -> WeightNameMap:
    """llama.cpp GGUF names of architecture ``glm4``."""
    return llama_naming.gguf_name_map(interleaved_qk=False, fused_gate_up=True) + [
        WeightRule(f"{_B}.post_attention_norm.weight", f"{_L}.post_self_attn_layernorm.weight"),
        WeightRule(f"{_B}.post_ffw_norm.weight", f"{_L}.post_mlp_layernorm.weight"),
    ]
