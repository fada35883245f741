"""How Hugging Face checkpoint names map onto MiniMax M2's parameters.

Mixtral's map (:func:`tallow_model_mixtral.naming.hf_name_map`: tallow-model-llama's attention,
norms, embeddings and head, the router ``block_sparse_moe.gate.weight`` and the experts
``block_sparse_moe.experts.{e}.{w1,w3,w2}.weight`` or transformers' stacked
``mlp.experts.{gate_up_proj,down_proj}``) plus, for decoder layer ``i``::

    model.layers.i.self_attn.{q_norm,k_norm}.weight [heads * head_dim] <- same names
                                                     (tallow-model-llama's rules)
    model.layers.i.mlp.gate.e_score_correction_bias [E]
        <- block_sparse_moe.e_score_correction_bias (published checkpoints)
           or mlp.e_score_correction_bias (transformers 5's state dict)

The correction bias sits on the MoE block in the checkpoints and on the router in
:class:`tallow.layers.FusedMoE`.
"""

from __future__ import annotations

from tallow.layers import WeightNameMap, WeightRule
from tallow_model_mixtral.naming import hf_name_map as mixtral_hf_name_map

_MLP = "model.layers.{i}.mlp"
_SPARSE = "model.layers.{i}.block_sparse_moe"


def hf_name_map() -> WeightNameMap:
    """Hugging Face ``model.safetensors`` names (and transformers 5's state dict)."""
    bias = f"{_MLP}.gate.e_score_correction_bias"
    return (
        WeightNameMap(
            [
                WeightRule(f"{_SPARSE}.e_score_correction_bias", bias),
                WeightRule(f"{_MLP}.e_score_correction_bias", bias),
            ]
        )
        + mixtral_hf_name_map()
    )
