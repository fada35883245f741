"""How the tensors of a Gemma 4 checkpoint map onto the parameters of
:class:`~tallow_model_gemma.gemma4.Gemma4ForCausalLM`.

The names are transformers' but for attention, whose parameters depend on the layer
(:class:`~tallow_model_gemma.gemma4_config.LayerPlan`)::

    own K/V:           self_attn.q_proj / k_proj / v_proj → self_attn.qkv_proj  shards q / k / v
    attention_k_eq_v:  self_attn.q_proj → self_attn.q_proj, self_attn.k_proj → self_attn.k_proj
    KV sharing:        self_attn.q_proj → self_attn.q_proj; k_proj, v_proj, k_norm (written
                       by some converters, unused by transformers too) skipped

and the dense MLP's ``gate_proj`` / ``up_proj`` (shards 0 / 1 of ``mlp.gate_up_proj``) and
the experts' stacked ``experts.gate_up_proj`` / ``experts.down_proj`` (or per-expert tensors,
:meth:`tallow.layers.FusedMoE.hf_weight_rules`). A ``Gemma4ForConditionalGeneration``
checkpoint holds the text model under ``model.language_model.``; its vision and audio towers
and their embedders are skipped (:class:`Gemma4TextModelNames`).
"""

from __future__ import annotations

import re

from tallow.layers import FusedMoE, WeightMatch, WeightNameMap, WeightRule

from .gemma4_config import LayerPlan

_L = "model.layers.{i}"
_A = f"{_L}.self_attn"
_LAYER_WEIGHTS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
    "post_feedforward_layernorm_1",
    "post_feedforward_layernorm_2",
    "pre_feedforward_layernorm_2",
    "post_per_layer_input_norm",
    "per_layer_input_gate",
    "per_layer_projection",
    "router.proj",
    "self_attn.q_norm",
    "self_attn.k_norm",
)
_ATTENTION = re.compile(r"model\.layers\.(\d+)\.self_attn\.")


def _same(name: str) -> WeightRule:
    return WeightRule(name, name)


def common_map() -> WeightNameMap:
    """Every name but the attention projections'."""
    rules = [
        _same("model.embed_tokens.weight"),
        _same("model.embed_tokens_per_layer.weight"),
        _same("model.per_layer_model_projection.weight"),
        _same("model.per_layer_projection_norm.weight"),
        _same("model.norm.weight"),
        _same("lm_head.weight"),
        _same(f"{_L}.layer_scalar"),
        _same(f"{_L}.router.scale"),
        _same(f"{_L}.router.per_expert_scale"),
        _same(f"{_A}.o_proj.{{p}}"),
        WeightRule(f"{_L}.mlp.gate_proj.{{p}}", f"{_L}.mlp.gate_up_proj.{{p}}", shard=0),
        WeightRule(f"{_L}.mlp.up_proj.{{p}}", f"{_L}.mlp.gate_up_proj.{{p}}", shard=1),
        _same(f"{_L}.mlp.down_proj.{{p}}"),
        *(_same(f"{_L}.{name}.weight") for name in _LAYER_WEIGHTS),
        *FusedMoE.hf_weight_rules(_L),
    ]
    return WeightNameMap(rules)


def _own_kv() -> WeightNameMap:
    return WeightNameMap(
        [
            WeightRule(f"{_A}.{x}_proj.{{p}}", f"{_A}.qkv_proj.{{p}}", shard=x)
            for x in ("q", "k", "v")
        ]
    )


def _k_eq_v() -> WeightNameMap:
    return WeightNameMap([_same(f"{_A}.q_proj.{{p}}"), _same(f"{_A}.k_proj.{{p}}")])


def _shared() -> WeightNameMap:
    return WeightNameMap(
        [
            _same(f"{_A}.q_proj.{{p}}"),
            *(WeightRule(f"{_A}.{x}.{{p}}") for x in ("k_proj", "v_proj", "k_norm", "v_norm")),
        ]
    )


class Gemma4Names:
    """The ``hf`` names of a Gemma 4 text checkpoint, attention matched per layer."""

    def __init__(self, plans: list[LayerPlan]) -> None:
        self.plans = plans
        self.common = common_map()
        self.own, self.k_eq_v, self.shared = _own_kv(), _k_eq_v(), _shared()

    def match(self, name: str) -> WeightMatch | None:
        found = _ATTENTION.match(name)
        if found and int(found.group(1)) < len(self.plans):
            plan = self.plans[int(found.group(1))]
            if plan.shared_from is not None:
                kind = self.shared
            elif plan.k_eq_v:
                kind = self.k_eq_v
            else:
                kind = self.own
            match = kind.match(name)
            if match is not None:
                return match
        return self.common.match(name)


class Gemma4TextModelNames:
    """A ``Gemma4ForConditionalGeneration`` checkpoint read as its text model: the text
    model's names under ``model.language_model.`` (and ``lm_head.``); the towers skipped."""

    SKIPPED_PREFIXES = (
        "model.vision_tower.",
        "model.audio_tower.",
        "model.embed_vision.",
        "model.embed_audio.",
    )

    def __init__(self, text: Gemma4Names) -> None:
        self.text = text

    def match(self, name: str) -> WeightMatch | None:
        if name.startswith(self.SKIPPED_PREFIXES):
            return WeightMatch(WeightRule(name), {})  # no target: skipped
        if name.startswith("model.language_model."):
            return self.text.match("model." + name[len("model.language_model.") :])
        if name.startswith("lm_head."):
            return self.text.match(name)
        return None
