"""How Phi-3 checkpoint tensor names map onto the model's parameters.

The parameters are the Llama family's (:mod:`tallow_model_llama.naming`). Hugging Face checkpoints
store ``self_attn.qkv_proj`` and ``mlp.gate_up_proj`` already fused; the Llama map loads them
whole and splits them on load, so Phi-3 uses it unchanged.

GGUF names (``naming="gguf"``, llama.cpp's ``phi3`` architecture; no row permutation: the file
keeps the Hugging Face rotary layout) → parameter:

    token_embd.weight            → model.embed_tokens.weight
    blk.i.attn_norm.weight       → model.layers.i.input_layernorm.weight
    blk.i.attn_qkv.weight        → model.layers.i.self_attn.qkv_proj.weight  (fused q|k|v)
    blk.i.attn_q/k/v.weight      → model.layers.i.self_attn.qkv_proj.weight  shard q/k/v
    blk.i.attn_output.weight     → model.layers.i.self_attn.o_proj.weight
    blk.i.ffn_norm.weight        → model.layers.i.post_attention_layernorm.weight
    blk.i.ffn_up.weight          → model.layers.i.mlp.gate_up_proj.weight  (fused gate|up)
    blk.i.ffn_down.weight        → model.layers.i.mlp.down_proj.weight
    output_norm.weight           → model.norm.weight
    output.weight                → lm_head.weight  (absent: the head is tied to token_embd)
    rope_factors_short.weight    → LongRoPE's short factors (handler ``load_rope_factors``)
    rope_factors_long.weight     → LongRoPE's long factors
"""

from __future__ import annotations

from tallow.layers import WeightNameMap, WeightRule
from tallow_model_llama import naming as llama_naming


def gguf_name_map() -> WeightNameMap:
    """llama.cpp GGUF names of architecture ``phi3``."""
    return llama_naming.gguf_name_map(interleaved_qk=False, fused_gate_up=True) + [
        WeightRule("rope_factors_{kind}.weight", handler="load_rope_factors"),
    ]
