"""How checkpoint tensor names map onto the parameters of the Gemma models.

Parameters of the tallow model (one decoder layer ``i``)::

    model.embed_tokens.weight                          [vocab, hidden]
    model.layers.i.input_layernorm.weight              [hidden]   scale 1 + weight
    model.layers.i.self_attn.qkv_proj.weight           [(Hq + 2 Hkv) * D, hidden]  shards q, k, v
    model.layers.i.self_attn.q_norm.weight             [D]  (Gemma 3)
    model.layers.i.self_attn.k_norm.weight             [D]  (Gemma 3)
    model.layers.i.self_attn.o_proj.weight             [hidden, Hq * D]
    model.layers.i.post_attention_layernorm.weight     [hidden]
    model.layers.i.pre_feedforward_layernorm.weight    [hidden]
    model.layers.i.mlp.gate_up_proj.weight             [2 * intermediate, hidden]  shards 0, 1
    model.layers.i.mlp.down_proj.weight                [hidden, intermediate]
    model.layers.i.post_feedforward_layernorm.weight   [hidden]
    model.norm.weight                                  [hidden]
    lm_head.weight       (Gemma ties it to the embedding; a separate one is loaded if present)

Hugging Face names are the same but for q/k/v and gate/up, stored apart. GGUF names
(llama.cpp's)::

    token_embd.weight            → model.embed_tokens.weight
    blk.i.attn_norm.weight       → model.layers.i.input_layernorm.weight             (*)
    blk.i.attn_q/attn_k/attn_v   → model.layers.i.self_attn.qkv_proj  shards q/k/v
    blk.i.attn_q_norm/attn_k_norm → model.layers.i.self_attn.q_norm/k_norm           (*)
    blk.i.attn_output            → model.layers.i.self_attn.o_proj
    blk.i.post_attention_norm    → model.layers.i.post_attention_layernorm           (*)
    blk.i.ffn_norm               → model.layers.i.pre_feedforward_layernorm          (*)
    blk.i.ffn_gate/ffn_up        → model.layers.i.mlp.gate_up_proj  shards 0/1
    blk.i.ffn_down               → model.layers.i.mlp.down_proj
    blk.i.post_ffw_norm          → model.layers.i.post_feedforward_layernorm         (*)
    output_norm.weight           → model.norm.weight                                 (*)
    output.weight                → lm_head.weight  (absent: tied to token_embd)

(*) Gemma's RMSNorm scales by ``1 + weight``. llama.cpp's converter stores ``weight + 1`` in
GGUF files of the ``gemma``, ``gemma2`` and ``gemma3`` architectures (its norm then multiplies
by the stored value; transformers' GGUF loader subtracts the 1 again), so loading subtracts 1
and both kinds of checkpoint fill the same ``1 + weight`` norm. Gemma's Q/K rows are not
permuted by the converter.

A ``Gemma3ForConditionalGeneration`` checkpoint holds the text model under
``language_model.model.`` / ``language_model.lm_head.`` (transformers before 4.52) or
``model.language_model.`` / ``lm_head.`` (later); its vision tower and projector are skipped
(:class:`TextModelNames`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tallow.layers import WeightMatch, WeightNameMap, WeightRule

if TYPE_CHECKING:  # pragma: no cover
    import torch

_L = "model.layers.{i}"
_B = "blk.{i}"
_NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
          "post_feedforward_layernorm")


def hf_name_map() -> WeightNameMap:
    """Hugging Face ``model.safetensors`` names."""
    rules = [
        WeightRule("model.embed_tokens.weight", "model.embed_tokens.weight"),
        WeightRule(f"{_L}.self_attn.q_proj.{{p}}", f"{_L}.self_attn.qkv_proj.{{p}}", shard="q"),
        WeightRule(f"{_L}.self_attn.k_proj.{{p}}", f"{_L}.self_attn.qkv_proj.{{p}}", shard="k"),
        WeightRule(f"{_L}.self_attn.v_proj.{{p}}", f"{_L}.self_attn.qkv_proj.{{p}}", shard="v"),
        WeightRule(f"{_L}.self_attn.o_proj.{{p}}", f"{_L}.self_attn.o_proj.{{p}}"),
        WeightRule(f"{_L}.self_attn.q_norm.weight", f"{_L}.self_attn.q_norm.weight"),
        WeightRule(f"{_L}.self_attn.k_norm.weight", f"{_L}.self_attn.k_norm.weight"),
        WeightRule(f"{_L}.mlp.gate_proj.{{p}}", f"{_L}.mlp.gate_up_proj.{{p}}", shard=0),
        WeightRule(f"{_L}.mlp.up_proj.{{p}}", f"{_L}.mlp.gate_up_proj.{{p}}", shard=1),
        WeightRule(f"{_L}.mlp.down_proj.{{p}}", f"{_L}.mlp.down_proj.{{p}}"),
        *(WeightRule(f"{_L}.{n}.weight", f"{_L}.{n}.weight") for n in _NORMS),
        WeightRule("model.norm.weight", "model.norm.weight"),
        WeightRule("lm_head.weight", "lm_head.weight"),
    ]
    return WeightNameMap(rules)


def gguf_name_map() -> WeightNameMap:
    """llama.cpp GGUF names of ``gemma2`` / ``gemma3`` files (norms shifted back, see above)."""
    shift = "norm_from_gguf"

    def norm(source: str, target: str) -> WeightRule:
        return WeightRule(source, target, transform=shift)

    return WeightNameMap([
        WeightRule("token_embd.weight", "model.embed_tokens.weight"),
        norm(f"{_B}.attn_norm.weight", f"{_L}.input_layernorm.weight"),
        WeightRule(f"{_B}.attn_q.{{p}}", f"{_L}.self_attn.qkv_proj.{{p}}", shard="q"),
        WeightRule(f"{_B}.attn_k.{{p}}", f"{_L}.self_attn.qkv_proj.{{p}}", shard="k"),
        WeightRule(f"{_B}.attn_v.{{p}}", f"{_L}.self_attn.qkv_proj.{{p}}", shard="v"),
        WeightRule(f"{_B}.attn_output.{{p}}", f"{_L}.self_attn.o_proj.{{p}}"),
        norm(f"{_B}.attn_q_norm.weight", f"{_L}.self_attn.q_norm.weight"),
        norm(f"{_B}.attn_k_norm.weight", f"{_L}.self_attn.k_norm.weight"),
        norm(f"{_B}.post_attention_norm.weight", f"{_L}.post_attention_layernorm.weight"),
        norm(f"{_B}.ffn_norm.weight", f"{_L}.pre_feedforward_layernorm.weight"),
        WeightRule(f"{_B}.ffn_gate.{{p}}", f"{_L}.mlp.gate_up_proj.{{p}}", shard=0),
        WeightRule(f"{_B}.ffn_up.{{p}}", f"{_L}.mlp.gate_up_proj.{{p}}", shard=1),
        WeightRule(f"{_B}.ffn_down.{{p}}", f"{_L}.mlp.down_proj.{{p}}"),
        norm(f"{_B}.post_ffw_norm.weight", f"{_L}.post_feedforward_layernorm.weight"),
        norm("output_norm.weight", "model.norm.weight"),
        WeightRule("output.weight", "lm_head.weight"),
    ])


def norm_from_gguf(tensor: "torch.Tensor") -> "torch.Tensor":
    """A GGUF norm weight (llama.cpp stores ``weight + 1``) as the checkpoint's ``weight``."""
    return tensor.float() - 1.0


class TextModelNames:
    """The names of the text model inside a ``Gemma3ForConditionalGeneration`` checkpoint,
    matched by the text model's own ``hf`` map; the vision tower and projector are skipped."""

    #: checkpoint prefix -> the text model's own prefix
    TEXT_PREFIXES = (("model.language_model.", "model."), ("language_model.model.", "model."),
                     ("language_model.lm_head.", "lm_head."), ("lm_head.", "lm_head."))
    SKIPPED_PREFIXES = ("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                        "model.multi_modal_projector.")

    def __init__(self, text: WeightNameMap) -> None:
        self.text = text

    def match(self, name: str) -> WeightMatch | None:
        if name.startswith(self.SKIPPED_PREFIXES):
            return WeightMatch(WeightRule(name), {})  # no target, no handler: skipped
        for prefix, own in self.TEXT_PREFIXES:
            if name.startswith(prefix):
                return self.text.match(own + name[len(prefix):])
        return None
