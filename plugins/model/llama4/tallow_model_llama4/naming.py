"""How Hugging Face checkpoint names map onto Llama 4's parameters: tallow-model-llama's map for
attention, norms, embeddings and head, plus the ``feed_forward`` block of layer ``i``
(the model's ``mlp``)::

    dense layers
    model.layers.i.mlp.gate_up_proj.weight   <- feed_forward.gate_proj / up_proj .weight
    model.layers.i.mlp.down_proj.weight      <- feed_forward.down_proj.weight
    MoE layers
    model.layers.i.mlp.gate.weight           <- feed_forward.router.weight           [E, H]
    model.layers.i.mlp.experts.w13_weight    <- feed_forward.experts.gate_up_proj    [E, H, 2I]
                                                (transposed: gate columns, then up)
    model.layers.i.mlp.experts.w2_weight     <- feed_forward.experts.down_proj       [E, I, H]
                                                (transposed)
    model.layers.i.mlp.shared_expert.gate_up_proj.weight
                                             <- feed_forward.shared_expert.gate_proj / up_proj
    model.layers.i.mlp.shared_expert.down_proj.weight
                                             <- feed_forward.shared_expert.down_proj.weight

Llama 4 stores its stacked experts input-major (``x @ W``), the transpose of the
``[E, out, in]`` layout of :class:`tallow.layers.FusedExperts`; the ``experts_to_rows``
transform of the model turns them.
"""

from __future__ import annotations

from tallow.layers import WeightMatch, WeightNameMap, WeightRule
from tallow_model_llama.naming import hf_name_map as llama_hf_name_map

_FF = "model.layers.{i}.feed_forward"
_MLP = "model.layers.{i}.mlp"


def hf_name_map() -> WeightNameMap:
    """Hugging Face ``model.safetensors`` names of a ``Llama4ForCausalLM``."""
    shared = f"{_MLP}.shared_expert"
    return llama_hf_name_map() + [
        WeightRule(f"{_FF}.gate_proj.weight", f"{_MLP}.gate_up_proj.weight", shard=0),
        WeightRule(f"{_FF}.up_proj.weight", f"{_MLP}.gate_up_proj.weight", shard=1),
        WeightRule(f"{_FF}.down_proj.weight", f"{_MLP}.down_proj.weight"),
        WeightRule(f"{_FF}.router.weight", f"{_MLP}.gate.weight"),
        WeightRule(
            f"{_FF}.experts.gate_up_proj", f"{_MLP}.experts.w13_weight", transform="experts_to_rows"
        ),
        WeightRule(
            f"{_FF}.experts.down_proj", f"{_MLP}.experts.w2_weight", transform="experts_to_rows"
        ),
        WeightRule(
            f"{_FF}.shared_expert.gate_proj.weight", f"{shared}.gate_up_proj.weight", shard=0
        ),
        WeightRule(f"{_FF}.shared_expert.up_proj.weight", f"{shared}.gate_up_proj.weight", shard=1),
        WeightRule(f"{_FF}.shared_expert.down_proj.weight", f"{shared}.down_proj.weight"),
    ]


class TextModelNames:
    """The names of the text model inside a ``Llama4ForConditionalGeneration`` checkpoint,
    matched by the text model's own map; the vision tower and the projector are skipped."""

    #: checkpoint prefix -> the text model's own prefix (transformers 5 writes the first;
    #: the in-memory names of its ``Llama4ForConditionalGeneration`` are the second)
    TEXT_PREFIXES = (("language_model.", ""), ("model.language_model.", "model."))
    SKIPPED_PREFIXES = (
        "vision_model.",
        "multi_modal_projector.",
        "model.vision_model.",
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
        return self.text.match(name)
