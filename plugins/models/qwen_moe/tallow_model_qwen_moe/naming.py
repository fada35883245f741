"""How Hugging Face checkpoint names map onto the Qwen-MoE models' parameters.

Layer ``i``'s parameters and the names that fill them::

    model.layers.i.self_attn.qkv_proj.{weight,bias}   <- self_attn.{q,k,v}_proj.*  (shard q/k/v)
    model.layers.i.self_attn.o_proj.weight            <- same name
    model.layers.i.self_attn.{q,k}_norm.weight        <- same name (Qwen3-MoE)
    model.layers.i.mlp.gate.weight        [E, H]      <- same name (the router)
    model.layers.i.mlp.experts.w13_weight [E, 2I, H]  <- mlp.experts.{e}.{gate,up}_proj.weight
                                                         or the stacked mlp.experts.gate_up_proj
    model.layers.i.mlp.experts.w2_weight  [E, H, I]   <- mlp.experts.{e}.down_proj.weight
                                                         or the stacked mlp.experts.down_proj
    model.layers.i.mlp.shared_expert.gate_up_proj.weight <- shared_expert.{gate,up}_proj.weight
    model.layers.i.mlp.shared_expert.down_proj.weight    <- same name        (Qwen2-MoE)
    model.layers.i.mlp.shared_expert_gate.weight  [1, H] <- same name        (Qwen2-MoE)
    model.layers.i.mlp.gate_up_proj.weight / down_proj.weight <- mlp.{gate,up,down}_proj.weight
                                                         (dense layers: ``mlp_only_layers``)
    model.layers.i.{input,post_attention}_layernorm.weight, model.norm.weight, lm_head.weight,
    model.embed_tokens.weight                          <- same name
"""

from __future__ import annotations

from tallow.layers import FusedMoE, WeightNameMap, WeightRule

_L = "model.layers.{i}"


def _gated_mlp(prefix: str) -> list[WeightRule]:
    return [
        WeightRule(f"{prefix}.gate_proj.{{p}}", f"{prefix}.gate_up_proj.{{p}}", shard=0),
        WeightRule(f"{prefix}.up_proj.{{p}}", f"{prefix}.gate_up_proj.{{p}}", shard=1),
        WeightRule(f"{prefix}.gate_up_proj.{{p}}", f"{prefix}.gate_up_proj.{{p}}"),
        WeightRule(f"{prefix}.down_proj.{{p}}", f"{prefix}.down_proj.{{p}}"),
    ]


def hf_name_map() -> WeightNameMap:
    """Hugging Face ``model.safetensors`` names."""
    return WeightNameMap([
        WeightRule("model.embed_tokens.weight", "model.embed_tokens.weight"),
        WeightRule(f"{_L}.self_attn.q_proj.{{p}}", f"{_L}.self_attn.qkv_proj.{{p}}", shard="q"),
        WeightRule(f"{_L}.self_attn.k_proj.{{p}}", f"{_L}.self_attn.qkv_proj.{{p}}", shard="k"),
        WeightRule(f"{_L}.self_attn.v_proj.{{p}}", f"{_L}.self_attn.qkv_proj.{{p}}", shard="v"),
        WeightRule(f"{_L}.self_attn.o_proj.{{p}}", f"{_L}.self_attn.o_proj.{{p}}"),
        WeightRule(f"{_L}.self_attn.q_norm.weight", f"{_L}.self_attn.q_norm.weight"),
        WeightRule(f"{_L}.self_attn.k_norm.weight", f"{_L}.self_attn.k_norm.weight"),
        WeightRule(f"{_L}.self_attn.rotary_emb.inv_freq"),
        WeightRule(f"{_L}.self_attn.k_scale", handler="load_k_cache_scale"),
        WeightRule(f"{_L}.self_attn.v_scale", handler="load_v_cache_scale"),
        *FusedMoE.hf_weight_rules(f"{_L}.mlp"),
        WeightRule(f"{_L}.mlp.gate.weight", f"{_L}.mlp.gate.weight"),
        WeightRule(f"{_L}.mlp.shared_expert_gate.weight", f"{_L}.mlp.shared_expert_gate.weight"),
        *_gated_mlp(f"{_L}.mlp.shared_expert"),
        *_gated_mlp(f"{_L}.mlp"),
        WeightRule(f"{_L}.input_layernorm.weight", f"{_L}.input_layernorm.weight"),
        WeightRule(f"{_L}.post_attention_layernorm.weight",
                   f"{_L}.post_attention_layernorm.weight"),
        WeightRule("model.norm.weight", "model.norm.weight"),
        WeightRule("lm_head.{p}", "lm_head.{p}"),
    ])
