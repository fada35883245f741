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

    An fp8 checkpoint's scales (``weight_scale_inv``, ``weight_scale``, ``input_scale``) go
    where their weight goes; those of ``in_proj_qkvz`` and ``in_proj_ba`` are reordered with
    its rows (block-wise scales: whole blocks of rows move, which needs each per-key-head part
    to be whole blocks, as it is in the published checkpoints).

The multi-token-prediction head of the checkpoints (``mtp.*``) is skipped here; under
``speculative.method: mtp`` the model loads it into its head (:mod:`tallow_model_qwen3_next.mtp`). Neither is a vision tower (``model.visual.*``): prompts are text.

A ``Qwen3_5ForConditionalGeneration`` / ``Qwen3_5MoeForConditionalGeneration`` checkpoint
holds the text model under ``model.language_model.`` (:class:`TextModelNames`).

GGUF names (llama.cpp's ``qwen3next``, ``qwen35``, ``qwen35moe``; matrices ``[out, in]``, float
or still block-quantized) → parameter, for block ``i``; what llama.cpp's converter changed is
undone by the transform in brackets (:mod:`tallow_model_qwen3_next.gguf_layout`)::

    token_embd.weight, output.weight         -> model.embed_tokens.weight, lm_head.weight
    output_norm.weight                       -> model.norm.weight               [- 1]
    blk.i.attn_norm.weight                   -> input_layernorm.weight          [- 1]
    blk.i.post_attention_norm.weight         -> post_attention_layernorm.weight [- 1]
    blk.i.attn_q.weight  [2 Hq D, H]         -> self_attn.q_proj.weight (query and gate per head)
    blk.i.attn_k.weight, attn_v.weight       -> self_attn.kv_proj.weight shards 0, 1
    blk.i.attn_output.weight                 -> self_attn.o_proj.weight
    blk.i.attn_{q,k}_norm.weight             -> self_attn.{q,k}_norm.weight     [- 1]
    blk.i.attn_qkv.weight [q | k | v]        -> linear_attn.in_proj_qkvz.weight shard 0  [V*]
    blk.i.attn_gate.weight [z]               -> linear_attn.in_proj_qkvz.weight shard 1  [V*]
    blk.i.ssm_in.weight (older qwen3next)    -> linear_attn.in_proj_qkvz.weight [per key head]
    blk.i.ssm_ba.weight (qwen3next)          -> linear_attn.in_proj_ba.weight   [per key head]
    blk.i.ssm_beta.weight, ssm_alpha.weight  -> linear_attn.in_proj_ba.weight shards 0, 1 [V*]
    blk.i.ssm_a          (-exp(A_log))       -> linear_attn.A_log               [log(-a), V*]
    blk.i.ssm_dt.bias                        -> linear_attn.dt_bias             [V*]
    blk.i.ssm_conv1d.weight [C, K]           -> linear_attn.conv1d.weight       [V*]
    blk.i.ssm_norm.weight                    -> linear_attn.norm.weight
    blk.i.ssm_out.weight                     -> linear_attn.out_proj.weight     [V* columns]
    blk.i.ffn_gate_inp.weight, ffn_{gate,up,down}_exps.weight -> the router and the experts
    blk.i.ffn_gate_up_exps.weight [E, 2I, H] -> mlp.experts.w13_weight (gate and up fused)
    blk.i.ffn_{gate,up}_shexp.weight         -> mlp.shared_expert.gate_up_proj.weight shards 0, 1
    blk.i.ffn_down_shexp.weight              -> mlp.shared_expert.down_proj.weight
    blk.i.ffn_gate_inp_shexp.weight [H]      -> mlp.shared_expert_gate.weight [1, H]
    blk.i.ffn_{gate,up}.weight, ffn_down     -> a dense MLP (Qwen3.5 dense)

[V*]: ``qwen35`` / ``qwen35moe`` files store the value heads tiled (``[v0 of every key head,
v1 of every key head, ...]``) rather than grouped by key head; loading puts them back.
Blocks past ``block_count - nextn_predict_layers`` hold the multi-token-prediction layers and
are skipped (:class:`MainBlockNames`).
"""

from __future__ import annotations

import re

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
        f"{_LIN}.out_proj.{{p}}",
        f"{_L}.input_layernorm.weight",
        f"{_L}.post_attention_layernorm.weight",
        "model.embed_tokens.weight",
        "model.norm.weight",
        "lm_head.{p}",
        f"{_MLP}.gate.weight",
        f"{_MLP}.shared_expert_gate.weight",
        f"{_SHARED}.down_proj.{{p}}",
        f"{_MLP}.down_proj.{{p}}",
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
            # an fp8 checkpoint's scales of the two (weight_scale_inv, weight_scale,
            # input_scale) follow the rows
            WeightRule(
                f"{_LIN}.in_proj_qkvz.{{s}}",
                f"{_LIN}.in_proj_qkvz.{{s}}",
                transform="qkvz_scale_rows",
            ),
            WeightRule(
                f"{_LIN}.in_proj_ba.{{s}}", f"{_LIN}.in_proj_ba.{{s}}", transform="ba_scale_rows"
            ),
            WeightRule(f"{_LIN}.in_proj_qkv.{{p}}", f"{_LIN}.in_proj_qkvz.{{p}}", shard=0),
            WeightRule(f"{_LIN}.in_proj_z.{{p}}", f"{_LIN}.in_proj_qkvz.{{p}}", shard=1),
            WeightRule(f"{_LIN}.in_proj_b.{{p}}", f"{_LIN}.in_proj_ba.{{p}}", shard=0),
            WeightRule(f"{_LIN}.in_proj_a.{{p}}", f"{_LIN}.in_proj_ba.{{p}}", shard=1),
            WeightRule(f"{_LIN}.conv1d.weight", f"{_LIN}.conv1d.weight", transform="conv_taps"),
            *FusedMoE.hf_weight_rules(_MLP),
            WeightRule(f"{_SHARED}.gate_proj.{{p}}", f"{_SHARED}.gate_up_proj.{{p}}", shard=0),
            WeightRule(f"{_SHARED}.up_proj.{{p}}", f"{_SHARED}.gate_up_proj.{{p}}", shard=1),
            WeightRule(f"{_MLP}.gate_proj.{{p}}", f"{_MLP}.gate_up_proj.{{p}}", shard=0),
            WeightRule(f"{_MLP}.up_proj.{{p}}", f"{_MLP}.gate_up_proj.{{p}}", shard=1),
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


_B = "blk.{i}"


def gguf_name_map(tiled_v_heads: bool) -> WeightNameMap:
    """llama.cpp GGUF names (see the module docstring); ``tiled_v_heads`` for ``qwen35`` and
    ``qwen35moe`` files, whose value heads need regrouping."""

    def v(transform: str) -> str | None:
        return transform if tiled_v_heads else None

    norm = "gguf_norm"
    return WeightNameMap(
        [
            WeightRule("token_embd.weight", "model.embed_tokens.weight"),
            WeightRule("output.weight", "lm_head.weight"),
            WeightRule("output_norm.weight", "model.norm.weight", transform=norm),
            WeightRule(f"{_B}.attn_norm.weight", f"{_L}.input_layernorm.weight", transform=norm),
            WeightRule(
                f"{_B}.post_attention_norm.weight",
                f"{_L}.post_attention_layernorm.weight",
                transform=norm,
            ),
            WeightRule(f"{_B}.attn_q.{{p}}", f"{_ATT}.q_proj.{{p}}"),
            WeightRule(f"{_B}.attn_k.{{p}}", f"{_ATT}.kv_proj.{{p}}", shard=0),
            WeightRule(f"{_B}.attn_v.{{p}}", f"{_ATT}.kv_proj.{{p}}", shard=1),
            WeightRule(f"{_B}.attn_output.{{p}}", f"{_ATT}.o_proj.{{p}}"),
            WeightRule(f"{_B}.attn_q_norm.weight", f"{_ATT}.q_norm.weight", transform=norm),
            WeightRule(f"{_B}.attn_k_norm.weight", f"{_ATT}.k_norm.weight", transform=norm),
            WeightRule(
                f"{_B}.attn_qkv.weight",
                f"{_LIN}.in_proj_qkvz.weight",
                shard=0,
                transform=v("gguf_qkv_rows"),
                rowwise=True,
            ),
            WeightRule(
                f"{_B}.attn_gate.weight",
                f"{_LIN}.in_proj_qkvz.weight",
                shard=1,
                transform=v("gguf_value_rows"),
                rowwise=True,
            ),
            WeightRule(
                f"{_B}.ssm_in.weight",
                f"{_LIN}.in_proj_qkvz.weight",
                transform="qkvz_rows",
                rowwise=True,
            ),
            WeightRule(
                f"{_B}.ssm_ba.weight",
                f"{_LIN}.in_proj_ba.weight",
                transform="ba_rows",
                rowwise=True,
            ),
            WeightRule(
                f"{_B}.ssm_beta.weight",
                f"{_LIN}.in_proj_ba.weight",
                shard=0,
                transform=v("gguf_head_rows"),
                rowwise=True,
            ),
            WeightRule(
                f"{_B}.ssm_alpha.weight",
                f"{_LIN}.in_proj_ba.weight",
                shard=1,
                transform=v("gguf_head_rows"),
                rowwise=True,
            ),
            WeightRule(
                f"{_B}.ssm_a",
                f"{_LIN}.A_log",
                transform="gguf_a_log_tiled" if tiled_v_heads else "gguf_a_log",
            ),
            WeightRule(f"{_B}.ssm_dt.bias", f"{_LIN}.dt_bias", transform=v("gguf_head_rows")),
            WeightRule(
                f"{_B}.ssm_conv1d.weight",
                f"{_LIN}.conv1d.weight",
                transform="gguf_conv_tiled" if tiled_v_heads else "gguf_conv",
            ),
            WeightRule(f"{_B}.ssm_norm.weight", f"{_LIN}.norm.weight"),
            WeightRule(
                f"{_B}.ssm_out.weight", f"{_LIN}.out_proj.weight", transform=v("gguf_out_columns")
            ),
            *FusedMoE.gguf_weight_rules(_B, _MLP),
            # gate and up of every expert in one tensor [E, 2I, H], gate first
            WeightRule(f"{_B}.ffn_gate_up_exps.weight", f"{_MLP}.experts.w13_weight"),
            WeightRule(f"{_B}.ffn_gate_shexp.weight", f"{_SHARED}.gate_up_proj.weight", shard=0),
            WeightRule(f"{_B}.ffn_up_shexp.weight", f"{_SHARED}.gate_up_proj.weight", shard=1),
            WeightRule(f"{_B}.ffn_down_shexp.weight", f"{_SHARED}.down_proj.weight"),
            WeightRule(
                f"{_B}.ffn_gate_inp_shexp.weight",
                f"{_MLP}.shared_expert_gate.weight",
                transform="gguf_as_row",
            ),
            WeightRule(f"{_B}.ffn_gate.weight", f"{_MLP}.gate_up_proj.weight", shard=0),
            WeightRule(f"{_B}.ffn_up.weight", f"{_MLP}.gate_up_proj.weight", shard=1),
            WeightRule(f"{_B}.ffn_down.weight", f"{_MLP}.down_proj.weight"),
        ]
    )


_BLOCK = re.compile(r"blk\.(\d+)\.")


class MainBlockNames:
    """GGUF names of a file whose blocks from ``first_skipped`` on are multi-token-prediction
    layers (``nextn_predict_layers``): those are known and skipped, the rest matched by
    ``names``."""

    def __init__(self, names: WeightNameMap, first_skipped: int) -> None:
        self.names = names
        self.first_skipped = first_skipped

    def match(self, name: str) -> WeightMatch | None:
        block = _BLOCK.match(name)
        if block is not None and int(block[1]) >= self.first_skipped:
            return WeightMatch(WeightRule(name), {})
        return self.names.match(name)
