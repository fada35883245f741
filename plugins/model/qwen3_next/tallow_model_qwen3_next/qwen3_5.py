"""Qwen3.5 (dense and mixture of experts) on Qwen3-Next's layers.

Qwen3.5's text model is Qwen3-Next's decoder with three differences, all taken care of
elsewhere: the linear-attention projections are stored apart (``in_proj_qkv``, ``in_proj_z``,
``in_proj_b``, ``in_proj_a``; :mod:`tallow_model_qwen3_next.naming`), the dense model has the
SwiGLU MLP in every layer (no ``num_experts``), and the MoE model renormalises its top-k
weights always (``norm_topk_prob`` absent means on). Its rotary embedding is multimodal
(``mrope_section``), which for text (the same position on the three axes) is plain RoPE over
``partial_rotary_factor`` of each head.

The ``...ForConditionalGeneration`` checkpoints (the published ones: a vision tower beside the
text model) serve their text model: the config's ``text_config``, the tensors under
``model.language_model.``; the vision tower is skipped, so prompts are text only.
"""

from __future__ import annotations

from typing import Any, Mapping

from tallow.layers import WeightNameMap

from .model import Qwen3NextForCausalLM
from .naming import TextModelNames, gguf_name_map, hf_name_map


#: llama.cpp's qwen35 / qwen35moe files store the value heads tiled (see gguf_layout)
_NAMES = {"hf": hf_name_map(), "gguf": gguf_name_map(tiled_v_heads=True)}


class Qwen3_5ForCausalLM(Qwen3NextForCausalLM):
    """Qwen3.5 dense (text model)."""

    hf_architectures = ("Qwen3_5ForCausalLM",)
    gguf_architectures = ("qwen35",)
    model_type = "qwen3_5_text"
    weight_name_maps = _NAMES
    gguf_experts = False


class Qwen3_5MoeForCausalLM(Qwen3NextForCausalLM):
    """Qwen3.5 mixture of experts (text model)."""

    hf_architectures = ("Qwen3_5MoeForCausalLM",)
    gguf_architectures = ("qwen35moe",)
    model_type = "qwen3_5_moe_text"
    weight_name_maps = _NAMES
    gguf_experts = True


def text_config(config: dict[str, Any], architectures: tuple[str, ...]) -> dict[str, Any]:
    """The ``text_config`` of a multimodal config, with what only the outer config states."""
    text = config.get("text_config")
    if text is None and "hidden_size" in config:
        return config  # already the text model's config
    if not isinstance(text, Mapping):
        raise ValueError(
            f"model config: a {architectures[0]} config needs a 'text_config' "
            f"object, got {type(text).__name__}"
        )
    flat = dict(text)
    for key in (
        "torch_dtype",
        "dtype",
        "eos_token_id",
        "bos_token_id",
        "pad_token_id",
        "tie_word_embeddings",
    ):
        if key in config and key not in flat:
            flat[key] = config[key]
    flat["architectures"] = list(config.get("architectures") or architectures)
    return flat


class _TextOfMultimodal:
    """What a ``...ForConditionalGeneration`` class adds to its text model's class: the
    ``text_config`` and the ``model.language_model.`` names (listed first among the bases)."""

    hf_architectures: tuple[str, ...]

    def __init__(self, config: Any, build: Any) -> None:
        flat = text_config(dict(config), self.hf_architectures)
        super().__init__(flat, build)  # type: ignore[call-arg]  # the model class, next in the MRO

    def weight_names(self, naming: str) -> WeightNameMap:
        names = super().weight_names(naming)  # type: ignore[misc]
        return TextModelNames(names) if naming == "hf" else names  # type: ignore[return-value]

    @classmethod
    def config_from_hf(cls, config: dict[str, Any]) -> dict[str, Any]:
        return text_config(config, cls.hf_architectures)


class Qwen3_5ForConditionalGeneration(_TextOfMultimodal, Qwen3_5ForCausalLM):
    """The text model of a Qwen3.5 dense checkpoint with a vision tower."""

    hf_architectures = ("Qwen3_5ForConditionalGeneration",)


class Qwen3_5MoeForConditionalGeneration(_TextOfMultimodal, Qwen3_5MoeForCausalLM):
    """The text model of a Qwen3.5 MoE checkpoint with a vision tower."""

    hf_architectures = ("Qwen3_5MoeForConditionalGeneration",)
