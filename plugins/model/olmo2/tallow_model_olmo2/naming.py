"""How OLMo 2 checkpoint tensor names map onto the model's parameters.

Parameters of one decoder layer ``i`` (no ``input_layernorm``)::

    model.layers.i.self_attn.qkv_proj.{weight,bias}   shards q, k, v (bias with attention_bias)
    model.layers.i.self_attn.q_norm.weight            [heads * head_dim]    (this rank's slice)
    model.layers.i.self_attn.k_norm.weight            [kv_heads * head_dim]
    model.layers.i.self_attn.o_proj.{weight,bias}
    model.layers.i.post_attention_layernorm.weight    [hidden]  on the attention output
    model.layers.i.mlp.gate_up_proj.weight, model.layers.i.mlp.down_proj.weight
    model.layers.i.post_feedforward_layernorm.weight  [hidden]  on the MLP output

Hugging Face names are the Llama family's (:mod:`tallow_model_llama.naming`) plus
``post_feedforward_layernorm`` under the same name.

GGUF names (``naming="gguf"``, llama.cpp's ``olmo2``; no row permutation) are the Llama
family's, plus:

    blk.i.post_attention_norm.weight → model.layers.i.post_attention_layernorm.weight
    blk.i.post_ffw_norm.weight       → model.layers.i.post_feedforward_layernorm.weight
    blk.i.attn_q_norm/attn_k_norm    → model.layers.i.self_attn.q_norm/k_norm.weight
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
            f"{_L}.post_feedforward_layernorm.weight", f"{_L}.post_feedforward_layernorm.weight"
        ),
    ]


def gguf_name_map() -> WeightNameMap:
    """llama.cpp GGUF names of architecture ``olmo2``."""
    return llama_naming.gguf_name_map(interleaved_qk=False) + [
        WeightRule(f"{_B}.post_attention_norm.weight", f"{_L}.post_attention_layernorm.weight"),
        WeightRule(f"{_B}.post_ffw_norm.weight", f"{_L}.post_feedforward_layernorm.weight"),
    ]
