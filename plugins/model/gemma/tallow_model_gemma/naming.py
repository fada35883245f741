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
_NORMS = (
    "input_layernorm",
    "post_attention_layernorm",
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
)


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

    return WeightNameMap(
        [
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
        ]
    )


def norm_from_gguf(tensor: "torch.Tensor") -> "torch.Tensor":
    """A GGUF norm weight (llama.cpp stores ``weight + 1``) as the checkpoint's ``weight``."""
    return tensor.float() - 1.0


class TextModelNames:
    """The names of the text model inside a ``Gemma3ForConditionalGeneration`` checkpoint,
    matched by the text model's own ``hf`` map; the vision tower and projector are skipped."""

    #: checkpoint prefix -> the text model's own prefix
    TEXT_PREFIXES = (
        ("model.language_model.", "model."),
        ("language_model.model.", "model."),
        ("language_model.lm_head.", "lm_head."),
        ("lm_head.", "lm_head."),
    )
    SKIPPED_PREFIXES = (
        "vision_tower.",
        "multi_modal_projector.",
        "model.vision_tower.",
        "model.multi_modal_projector.",
    )

    def __init__(self, text: WeightNameMap) -> None:
        self.text = text

    def match(self, name: str) -> WeightMatch | None:
        if name.startswith(self.SKIPPED_PREFIXES):
            return WeightMatch(WeightRule(name), {})  # no target, no handler: skipped
        for prefix, own in self.TEXT_PREFIXES:
            if name.startswith(prefix):
                return self.text.match(own + name[len(prefix) :])
        return None


_VL = "vision_tower.layers.{i}"


def vision_name_map() -> WeightNameMap:
    """The SigLIP tower and projector of a ``Gemma3ForConditionalGeneration`` checkpoint, from
    the names below ``vision_tower.`` / ``multi_modal_projector.`` (prefixes already made
    uniform by :class:`VisionModelNames`)."""
    enc = "vision_tower.encoder.layers.{i}"
    return WeightNameMap(
        [
            WeightRule(
                "vision_tower.embeddings.patch_embedding.weight",
                "vision_tower.patch_embedding.weight",
                transform="flatten_patch_embed",
            ),
            WeightRule(
                "vision_tower.embeddings.patch_embedding.bias", "vision_tower.patch_embedding.bias"
            ),
            WeightRule(
                "vision_tower.embeddings.position_embedding.weight",
                "vision_tower.position_embedding",
            ),
            *(
                WeightRule(f"{enc}.{part}.{{p}}", f"{_VL}.{part}.{{p}}")
                for part in (
                    "layer_norm1",
                    "layer_norm2",
                    "self_attn.q_proj",
                    "self_attn.k_proj",
                    "self_attn.v_proj",
                    "self_attn.out_proj",
                )
            ),
            WeightRule(f"{enc}.mlp.{{m}}.{{p}}", f"{_VL}.{{m}}.{{p}}"),
            WeightRule("vision_tower.post_layernorm.{p}", "vision_tower.post_layernorm.{p}"),
            WeightRule(
                "multi_modal_projector.mm_input_projection_weight", "vision_tower.projection"
            ),
            WeightRule(
                "multi_modal_projector.mm_soft_emb_norm.weight", "vision_tower.soft_emb_norm.weight"
            ),
        ]
    )


class VisionModelNames(TextModelNames):
    """A ``Gemma3ForConditionalGeneration`` checkpoint with its vision tower: the text model's
    names as :class:`TextModelNames` reads them, the tower's and projector's by
    :func:`vision_name_map`. SigLIP's pooling head (``head.*``), which Gemma 3 does not use, is
    skipped."""

    #: checkpoint prefix -> the prefix the vision map knows (older and newer layouts)
    VISION_PREFIXES = (
        ("model.vision_tower.vision_model.", "vision_tower."),
        ("vision_tower.vision_model.", "vision_tower."),
        ("model.vision_tower.", "vision_tower."),
        ("model.multi_modal_projector.", "multi_modal_projector."),
    )

    def __init__(self, text: WeightNameMap) -> None:
        super().__init__(text)
        self.vision = vision_name_map()

    def match(self, name: str) -> WeightMatch | None:
        for prefix, own in self.VISION_PREFIXES:
            if name.startswith(prefix):
                name = own + name[len(prefix) :]
                break
        if name.startswith("vision_tower.head."):
            return WeightMatch(WeightRule(name), {})  # SigLIP's pooling head: unused
        if name.startswith(("vision_tower.", "multi_modal_projector.")):
            return self.vision.match(name)
        return super().match(name)
