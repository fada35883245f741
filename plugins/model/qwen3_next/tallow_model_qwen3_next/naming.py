"""How Hugging Face checkpoint names map onto Qwen3-Next's parameters (layer ``i``)::

    model.embed_tokens.weight, model.norm.weight, lm_head.weight      <- same names
    model.layers.i.{input,post_attention}_layernorm.weight             <- same names

    full-attention layers
    model.layers.i.self_attn.q_proj.*     [2 Hq D, H]  <- same name (per head: query, gate)
    model.layers.i.self_attn.kv_proj.*    [2 Hkv D, H] <- self_attn.k_proj (shard 0),
                                                          self_attn.v_proj (shard 1)
    model.layers.i.self_attn.{o_proj.*, q_norm.weight, k_norm.weight} <- same names

    linear-attention layers
    model.layers.i.linear_attn.in_proj_qkvz.weight  <- same name, rows reordered per key head
                                                       into [q | k | v | z] (Qwen3-Next);
                                                       in_proj_qkv (shard 0), in_proj_z (shard 1)
                                                       (Qwen3.5)
    model.layers.i.linear_attn.in_proj_ba.weight    <- same name, rows reordered into [b | a];
                                                       in_proj_b (shard 0), in_proj_a (shard 1)
    model.layers.i.linear_attn.conv1d.weight [C, K] <- same name [C, 1, K]
    model.layers.i.linear_attn.{dt_bias, A_log, norm.weight, out_proj.weight} <- same names

    MLP: the routed experts (per expert or stacked, :meth:`tallow.layers.FusedMoE
    .hf_weight_rules`), mlp.gate (the router), mlp.shared_expert.{gate,up,down}_proj,
    mlp.shared_expert_gate; a dense layer's mlp.{gate,up,down}_proj.

The multi-token-prediction head of the checkpoints (``mtp.*``) is not loaded: nothing in the
engine runs it yet. Neither is a vision tower (``model.visual.*``): prompts are text.

A ``Qwen3_5ForConditionalGeneration`` / ``Qwen3_5MoeForConditionalGeneration`` checkpoint
holds the text model under ``model.language_model.`` (:class:`TextModelNames`).
"""

from __future__ import annotations

from tallow.layers import FusedMoE, WeightMatch, WeightNameMap, WeightRule

_L = "model.layers.{i}"
_ATT = f"{_L}.self_attn"
_LIN = f"{_L}.linear_attn"
_MLP = f"{_L}.mlp"
_SHARED = f"{_MLP}.shared_expert"

#: the deepest skipped name below ``mtp.`` / ``model.visual.``
#: (mtp.layers.0.mlp.experts.{e}.gate_proj.weight)
_SKIP_DEPTH = 8


def _skipped(prefix: str) -> list[WeightRule]:
    """Rules that skip every name below ``prefix`` (a rule's field is one dotted component)."""
    return [
        WeightRule(prefix + "".join(f".{{m{j}}}" for j in range(depth)))
        for depth in range(1, _SKIP_DEPTH + 1)
    ]


def hf_name_map() -> WeightNameMap:
    """Hugging Face ``model.safetensors`` names."""
    same = [
        f"{_ATT}.o_proj.{{p}}",
        f"{_ATT}.q_proj.{{p}}",
        f"{_ATT}.q_norm.weight",
        f"{_ATT}.k_norm.weight",
        f"{_LIN}.dt_bias",
        f"{_LIN}.A_log",
        f"{_LIN}.norm.weight",
        f"{_LIN}.out_proj.weight",
        f"{_L}.input_layernorm.weight",
        f"{_L}.post_attention_layernorm.weight",
        "model.embed_tokens.weight",
        "model.norm.weight",
        "lm_head.{p}",
        f"{_MLP}.gate.weight",
        f"{_MLP}.shared_expert_gate.weight",
        f"{_SHARED}.down_proj.weight",
        f"{_MLP}.down_proj.weight",
    ]
    return WeightNameMap(
        [
            *[WeightRule(name, name) for name in same],
            WeightRule(f"{_ATT}.k_proj.{{p}}", f"{_ATT}.kv_proj.{{p}}", shard=0),
            WeightRule(f"{_ATT}.v_proj.{{p}}", f"{_ATT}.kv_proj.{{p}}", shard=1),
            WeightRule(
                f"{_LIN}.in_proj_qkvz.weight",
                f"{_LIN}.in_proj_qkvz.weight",
                transform="qkvz_rows",
                rowwise=True,
            ),
            WeightRule(
                f"{_LIN}.in_proj_ba.weight",
                f"{_LIN}.in_proj_ba.weight",
                transform="ba_rows",
                rowwise=True,
            ),
            WeightRule(f"{_LIN}.in_proj_qkv.weight", f"{_LIN}.in_proj_qkvz.weight", shard=0),
            WeightRule(f"{_LIN}.in_proj_z.weight", f"{_LIN}.in_proj_qkvz.weight", shard=1),
            WeightRule(f"{_LIN}.in_proj_b.weight", f"{_LIN}.in_proj_ba.weight", shard=0),
            WeightRule(f"{_LIN}.in_proj_a.weight", f"{_LIN}.in_proj_ba.weight", shard=1),
            WeightRule(f"{_LIN}.conv1d.weight", f"{_LIN}.conv1d.weight", transform="conv_taps"),
            *FusedMoE.hf_weight_rules(_MLP),
            WeightRule(f"{_SHARED}.gate_proj.weight", f"{_SHARED}.gate_up_proj.weight", shard=0),
            WeightRule(f"{_SHARED}.up_proj.weight", f"{_SHARED}.gate_up_proj.weight", shard=1),
            WeightRule(f"{_MLP}.gate_proj.weight", f"{_MLP}.gate_up_proj.weight", shard=0),
            WeightRule(f"{_MLP}.up_proj.weight", f"{_MLP}.gate_up_proj.weight", shard=1),
            *_skipped("mtp"),
            *_skipped("model.visual"),
        ]
    )


class TextModelNames:
    """The names of a ``...ForConditionalGeneration`` checkpoint's text model
    (``model.language_model.*``, ``lm_head.*``), matched by the text model's own map; the
    vision tower and the MTP head are skipped."""

    def __init__(self, text: WeightNameMap) -> None:
        self.text = text

    def match(self, name: str) -> WeightMatch | None:
        prefix = "model.language_model."
        if name.startswith(prefix):
            return self.text.match("model." + name[len(prefix) :])
        return self.text.match(name)
