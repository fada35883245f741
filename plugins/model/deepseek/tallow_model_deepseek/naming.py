"""How Hugging Face checkpoint names map onto the DeepSeek models' parameters.

tallow-model-llama's map gives the embedding, the norms, the dense MLP of the first layers and the
head; on top of it, for decoder layer ``i``::

    model.layers.i.self_attn.{q_proj, q_a_proj, q_a_layernorm, q_b_proj,
        kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj}.*   <- same names
    model.layers.i.mlp.gate.weight                  [E, H]  <- same name (the router)
    model.layers.i.mlp.gate.e_score_correction_bias [E]     <- same name (V3)
    model.layers.i.mlp.experts.w13_weight / w2_weight        <- per-expert or stacked experts
    model.layers.i.mlp.shared_expert.gate_up_proj.*  <- mlp.shared_experts.{gate,up}_proj.*
    model.layers.i.mlp.shared_expert.down_proj.*     <- mlp.shared_experts.down_proj.*

The other ``.{p}`` parts (``weight_scale_inv`` of block-fp8 checkpoints, say) go to the
parameter of the same name, which a quantization scheme creates. Layers at or past
``num_hidden_layers`` (V3's multi-token prediction module) are not this model's:
:func:`mtp_layer` tells them apart.
"""

from __future__ import annotations

import re

from tallow.layers import FusedMoE, WeightNameMap, WeightRule
from tallow_model_llama.naming import hf_name_map as llama_hf_name_map

_L = "model.layers.{i}"
_MLP = f"{_L}.mlp"
_SHARED = f"{_MLP}.shared_experts"
_ATTENTION = (
    "q_proj",
    "q_a_proj",
    "q_a_layernorm",
    "q_b_proj",
    "kv_a_proj_with_mqa",
    "kv_a_layernorm",
    "kv_b_proj",
    "o_proj",
)
_LAYER = re.compile(r"model\.layers\.(\d+)\.")


def moe_rules() -> list[WeightRule]:
    """The MoE block's names (router, correction bias, experts, shared experts), shared with
    the models that use the same block (GLM-4.5)."""
    return [
        WeightRule(f"{_MLP}.gate.weight", f"{_MLP}.gate.weight"),
        WeightRule(f"{_MLP}.gate.e_score_correction_bias", f"{_MLP}.gate.e_score_correction_bias"),
        *FusedMoE.hf_weight_rules(_MLP),
        WeightRule(
            f"{_SHARED}.gate_proj.{{p}}", f"{_MLP}.shared_expert.gate_up_proj.{{p}}", shard=0
        ),
        WeightRule(f"{_SHARED}.up_proj.{{p}}", f"{_MLP}.shared_expert.gate_up_proj.{{p}}", shard=1),
        WeightRule(f"{_SHARED}.down_proj.{{p}}", f"{_MLP}.shared_expert.down_proj.{{p}}"),
    ]


def hf_name_map() -> WeightNameMap:
    """Hugging Face ``model.safetensors`` names (the latent attention's rules first: they
    come before tallow-model-llama's ``q_proj`` -> ``qkv_proj`` rule)."""
    attention = [
        WeightRule(f"{_L}.self_attn.{name}.{{p}}", f"{_L}.self_attn.{name}.{{p}}")
        for name in _ATTENTION
    ]
    return WeightNameMap([*attention, *moe_rules()]) + llama_hf_name_map()


def mtp_layer(name: str, num_hidden_layers: int) -> bool:
    """Whether checkpoint tensor ``name`` belongs to a layer past the decoder's last (the
    multi-token prediction module of V3 checkpoints, which this model does not run)."""
    m = _LAYER.match(name)
    return m is not None and int(m.group(1)) >= num_hidden_layers
