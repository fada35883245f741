"""How Hugging Face checkpoint names map onto the Qwen-MoE models' parameters: tallow-llama's
map (attention, norms, embeddings, head, and the dense MLP of ``mlp_only_layers``) plus the MoE
block's names for layer ``i``::

    model.layers.i.mlp.gate.weight        [E, H]      <- same name (the router)
    model.layers.i.mlp.experts.w13_weight [E, 2I, H]  <- mlp.experts.{e}.{gate,up}_proj.weight
                                                         or the stacked mlp.experts.gate_up_proj
    model.layers.i.mlp.experts.w2_weight  [E, H, I]   <- mlp.experts.{e}.down_proj.weight
                                                         or the stacked mlp.experts.down_proj
    model.layers.i.mlp.shared_expert.gate_up_proj.weight <- shared_expert.{gate,up}_proj.weight
    model.layers.i.mlp.shared_expert.down_proj.weight    <- same name        (Qwen2-MoE)
    model.layers.i.mlp.shared_expert_gate.weight  [1, H] <- same name        (Qwen2-MoE)
"""

from __future__ import annotations

from tallow.layers import FusedMoE, WeightNameMap, WeightRule
from tallow_llama.naming import hf_name_map as llama_hf_name_map

_MLP = "model.layers.{i}.mlp"
_SHARED = f"{_MLP}.shared_expert"


def hf_name_map() -> WeightNameMap:
    """Hugging Face ``model.safetensors`` names."""
    return llama_hf_name_map() + [
        *FusedMoE.hf_weight_rules(_MLP),
        WeightRule(f"{_MLP}.gate.weight", f"{_MLP}.gate.weight"),
        WeightRule(f"{_MLP}.shared_expert_gate.weight", f"{_MLP}.shared_expert_gate.weight"),
        WeightRule(f"{_SHARED}.gate_proj.weight", f"{_SHARED}.gate_up_proj.weight", shard=0),
        WeightRule(f"{_SHARED}.up_proj.weight", f"{_SHARED}.gate_up_proj.weight", shard=1),
        WeightRule(f"{_SHARED}.down_proj.weight", f"{_SHARED}.down_proj.weight"),
    ]
