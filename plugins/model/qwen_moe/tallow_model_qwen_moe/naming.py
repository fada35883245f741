"""How Hugging Face checkpoint names map onto the Qwen-MoE models' parameters: tallow-model-llama's
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

GGUF names (llama.cpp's ``qwen3moe`` and ``qwen2moe``): tallow-model-llama's GGUF map (no Q/K row
permutation) plus, for block ``i``::

    blk.i.ffn_gate_inp.weight   [E, H]     -> mlp.gate.weight (the router)
    blk.i.ffn_gate_exps.weight  [E, I, H]  -> mlp.experts.w13_weight, every expert's gate
    blk.i.ffn_up_exps.weight    [E, I, H]  -> mlp.experts.w13_weight, every expert's up
    blk.i.ffn_down_exps.weight  [E, H, I]  -> mlp.experts.w2_weight
    blk.i.ffn_gate_shexp.weight, ffn_up_shexp.weight -> mlp.shared_expert.gate_up_proj (qwen2moe)
    blk.i.ffn_down_shexp.weight                      -> mlp.shared_expert.down_proj
    blk.i.ffn_gate_inp_shexp.weight  [H] or [1, H]   -> mlp.shared_expert_gate.weight [1, H]

The experts may be float or still block-quantized (a scheme such as tallow-quant-gguf keeps
them so).
"""

from __future__ import annotations

from tallow.layers import FusedMoE, WeightNameMap, WeightRule
from tallow_model_llama.naming import gguf_name_map as llama_gguf_name_map
from tallow_model_llama.naming import hf_name_map as llama_hf_name_map

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


_BLK = "blk.{i}"


def gguf_name_map() -> WeightNameMap:
    """llama.cpp GGUF names of ``qwen3moe`` and ``qwen2moe`` files."""
    return llama_gguf_name_map(interleaved_qk=False) + [
        *FusedMoE.gguf_weight_rules(_BLK, _MLP),
        WeightRule(f"{_BLK}.ffn_gate_shexp.weight", f"{_SHARED}.gate_up_proj.weight", shard=0),
        WeightRule(f"{_BLK}.ffn_up_shexp.weight", f"{_SHARED}.gate_up_proj.weight", shard=1),
        WeightRule(f"{_BLK}.ffn_down_shexp.weight", f"{_SHARED}.down_proj.weight"),
        WeightRule(
            f"{_BLK}.ffn_gate_inp_shexp.weight",
            f"{_MLP}.shared_expert_gate.weight",
            transform="as_row",
        ),
    ]
