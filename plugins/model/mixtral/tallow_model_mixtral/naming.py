"""How Hugging Face checkpoint names map onto Mixtral's parameters: tallow-model-llama's map
(attention, norms, embeddings, head) plus the sparse MoE block of layer ``i``::

    model.layers.i.mlp.gate.weight        [E, H]      <- block_sparse_moe.gate.weight
                                                         (or mlp.gate.weight)
    model.layers.i.mlp.experts.w13_weight [E, 2I, H]  <- block_sparse_moe.experts.{e}.w1 (gate)
                                                         and .w3 (up) .weight,
                                                         or the stacked mlp.experts.gate_up_proj
    model.layers.i.mlp.experts.w2_weight  [E, H, I]   <- block_sparse_moe.experts.{e}.w2.weight,
                                                         or the stacked mlp.experts.down_proj

The ``block_sparse_moe`` names are those of the published checkpoints (and of what
transformers 5 writes back on ``save_pretrained``); the ``mlp.`` ones are transformers 5's
in-memory names (its state dict).

GGUF names (llama.cpp writes Mixtral as architecture ``llama`` with ``llama.expert_count``;
Q/K rows interleaved as in every ``llama`` file): tallow-model-llama's GGUF map plus, for block
``i``, the router ``blk.i.ffn_gate_inp.weight`` and the stacked experts
``blk.i.ffn_{gate,up,down}_exps.weight`` (:meth:`tallow.layers.FusedMoE.gguf_weight_rules`),
or the per-expert ``blk.i.ffn_{gate,up,down}.{e}.weight`` of older files.
"""

from __future__ import annotations

from tallow.layers import FusedMoE, WeightNameMap, WeightRule
from tallow_model_llama.naming import gguf_name_map as llama_gguf_name_map
from tallow_model_llama.naming import hf_name_map as llama_hf_name_map

_MLP = "model.layers.{i}.mlp"
_SPARSE = "model.layers.{i}.block_sparse_moe"

#: Mixtral's expert names -> (stacked parameter, part)
_EXPERT_PARTS = {"w1": ("w13", "gate"), "w3": ("w13", "up"), "w2": ("w2", "down")}


def hf_name_map() -> WeightNameMap:
    """Hugging Face ``model.safetensors`` names (and transformers 5's state dict)."""
    return llama_hf_name_map() + [
        *FusedMoE.hf_weight_rules(_MLP),
        *[
            WeightRule(
                f"{_SPARSE}.experts.{{e}}.{name}.weight",
                f"{_MLP}.experts.{stacked}_weight",
                shard=("{e}", part),
            )
            for name, (stacked, part) in _EXPERT_PARTS.items()
        ],
        WeightRule(f"{_SPARSE}.gate.weight", f"{_MLP}.gate.weight"),
        WeightRule(f"{_MLP}.gate.weight", f"{_MLP}.gate.weight"),
    ]


_BLK = "blk.{i}"
#: the per-expert GGUF names of older Mixtral files -> (stacked parameter, part)
_GGUF_EXPERT_PARTS = {
    "ffn_gate": ("w13", "gate"),
    "ffn_up": ("w13", "up"),
    "ffn_down": ("w2", "down"),
}


def gguf_name_map() -> WeightNameMap:
    """llama.cpp GGUF names of a Mixtral (architecture ``llama`` with experts)."""
    per_expert = [
        WeightRule(
            f"{_BLK}.{name}.{{e}}.weight", f"{_MLP}.experts.{stacked}_weight", shard=("{e}", part)
        )
        for name, (stacked, part) in _GGUF_EXPERT_PARTS.items()
    ]
    return llama_gguf_name_map(interleaved_qk=True) + [
        *FusedMoE.gguf_weight_rules(_BLK, _MLP),
        *per_expert,
    ]
