"""Checkpoint tensor names of Qwen2.5-VL and Qwen2-VL.

Two layouts exist: the original one (``visual.*``, ``model.layers.*``, ``lm_head.*``) and the
one transformers 5 saves (``model.visual.*``, ``model.language_model.*``, ``lm_head.*``). The
text model's names are the Llama family's (tallow-model-llama's ``hf`` map); the vision tower's:

    visual.patch_embed.proj.weight  [dim, C, T, P, P] → visual.patch_embed.proj.weight
                                     [dim, C*T*P*P] (the Conv3d as the linear map it is)
    visual.blocks.i.{norm1,norm2}.*, .attn.{qkv,proj}.*, .mlp.{gate,up,down}_proj.*
    (Qwen2-VL: .mlp.{fc1,fc2}.*)   → same name
    visual.merger.ln_q.*           → same name
    visual.merger.mlp.{0,2}.*      → visual.merger.fc{1,2}.*

Qwen3-VL's tower (:func:`qwen3_vision_name_map`) keeps its checkpoint names but for the patch
embedding (biased, flattened as above) and its blocks' MLPs (``linear_fc{1,2}`` → ``fc{1,2}``,
the parts it shares with Qwen2-VL's): ``visual.pos_embed.weight`` → ``visual.pos_embed``,
``visual.merger.{norm,linear_fc1,linear_fc2}.*`` and
``visual.deepstack_merger_list.j.{norm,linear_fc1,linear_fc2}.*`` → same names.
"""

from __future__ import annotations

from tallow.layers import WeightMatch, WeightNameMap, WeightRule

_V = "visual.blocks.{i}"


def vision_name_map() -> WeightNameMap:
    return WeightNameMap(
        [
            WeightRule(
                "visual.patch_embed.proj.weight",
                "visual.patch_embed.weight",
                transform="flatten_patch_embed",
            ),
            WeightRule(f"{_V}.norm1.{{p}}", f"{_V}.norm1.{{p}}"),
            WeightRule(f"{_V}.norm2.{{p}}", f"{_V}.norm2.{{p}}"),
            WeightRule(f"{_V}.attn.qkv.{{p}}", f"{_V}.attn.qkv.{{p}}"),
            WeightRule(f"{_V}.attn.proj.{{p}}", f"{_V}.attn.proj.{{p}}"),
            WeightRule(f"{_V}.mlp.{{m}}.{{p}}", f"{_V}.mlp.{{m}}.{{p}}"),
            WeightRule("visual.merger.ln_q.{p}", "visual.merger.ln_q.{p}"),
            WeightRule("visual.merger.mlp.0.{p}", "visual.merger.fc1.{p}"),
            WeightRule("visual.merger.mlp.2.{p}", "visual.merger.fc2.{p}"),
        ]
    )


def qwen3_vision_name_map() -> WeightNameMap:
    return WeightNameMap(
        [
            WeightRule(
                "visual.patch_embed.proj.weight",
                "visual.patch_embed.weight",
                transform="flatten_patch_embed",
            ),
            WeightRule("visual.patch_embed.proj.bias", "visual.patch_embed.bias"),
            WeightRule("visual.pos_embed.weight", "visual.pos_embed"),
            WeightRule(f"{_V}.norm1.{{p}}", f"{_V}.norm1.{{p}}"),
            WeightRule(f"{_V}.norm2.{{p}}", f"{_V}.norm2.{{p}}"),
            WeightRule(f"{_V}.attn.qkv.{{p}}", f"{_V}.attn.qkv.{{p}}"),
            WeightRule(f"{_V}.attn.proj.{{p}}", f"{_V}.attn.proj.{{p}}"),
            WeightRule(f"{_V}.mlp.linear_fc1.{{p}}", f"{_V}.mlp.fc1.{{p}}"),
            WeightRule(f"{_V}.mlp.linear_fc2.{{p}}", f"{_V}.mlp.fc2.{{p}}"),
            WeightRule("visual.merger.{m}.{p}", "visual.merger.{m}.{p}"),
            WeightRule(
                "visual.deepstack_merger_list.{j}.{m}.{p}",
                "visual.deepstack_merger_list.{j}.{m}.{p}",
            ),
        ]
    )


class Qwen2VLNames:
    """Either layout's names, matched by the vision map or the text model's map."""

    #: checkpoint prefix -> the prefix the maps know
    PREFIXES = (
        ("model.visual.", "visual."),
        ("model.language_model.", "model."),
        ("language_model.model.", "model."),
        ("language_model.lm_head.", "lm_head."),
    )

    def __init__(self, text: WeightNameMap, vision: WeightNameMap | None = None) -> None:
        self.text = text
        self.vision = vision if vision is not None else vision_name_map()

    def match(self, name: str) -> WeightMatch | None:
        for prefix, own in self.PREFIXES:
            if name.startswith(prefix):
                name = own + name[len(prefix) :]
                break
        if name.startswith("visual."):
            return self.vision.match(name)
        return self.text.match(name)
