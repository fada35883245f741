"""Qwen2.5-VL and Qwen2-VL: images in, text out.

The text model is tallow-model-llama's Qwen2 decoder with M-RoPE (:class:`tallow.layers.MRotaryEmbedding`:
three position axes, ``mrope_section`` frequencies each); the vision tower is
:mod:`tallow_model_qwen2_vl.vision`. The engine expands each ``<|image_pad|>`` of a prompt into
the image's tokens (:meth:`process_image` says how many), runs :meth:`encode_image` and hands
the embeddings and the three-axis positions to :meth:`forward` through the step's
:class:`tallow.layers.MultimodalStep`.

Qwen2-VL (the first generation) differs only in its vision tower (LayerNorms, full attention
in every block, a two-layer MLP): :class:`Qwen2VLForConditionalGeneration`.

Qwen3-VL (:class:`Qwen3VLForConditionalGeneration`) is tallow-model-llama's Qwen3 decoder (per-head
q/k norms) with interleaved M-RoPE
(:class:`~tallow_model_qwen2_vl.mrope.InterleavedMRotaryEmbedding`) and :mod:`tallow_model_qwen2_vl.vision3`'s tower, whose DeepStack features are added to the
image tokens' hidden states after the first decoder layers. The parts all three share live in
:class:`QwenVLModel`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from tallow.layers import (
    ArchConfig,
    BuildContext,
    MRotaryEmbedding,
    MultimodalStep,
    PlacedImage,
    ProcessedImage,
    RotaryEmbedding,
    VisionLanguageModel,
    WeightNameMap,
    current_multimodal_step,
    merge_multimodal_embeddings,
)
from tallow_model_llama.model import Qwen2ForCausalLM, Qwen3ForCausalLM

from .mrope import InterleavedMRotaryEmbedding
from .naming import Qwen2VLNames, qwen3_vision_name_map, vision_name_map
from .processor import QWEN2_DEFAULTS, QWEN3_DEFAULTS, ImageProcessor, mrope_positions
from .vision import Qwen2_5_VisionTower, Qwen2VisionTower
from .vision3 import Qwen3VisionTower

#: what only the outer config of a transformers 5 checkpoint states
_OUTER_KEYS = (
    "torch_dtype",
    "dtype",
    "eos_token_id",
    "bos_token_id",
    "pad_token_id",
    "tie_word_embeddings",
    "image_token_id",
    "video_token_id",
    "vision_start_token_id",
    "vision_end_token_id",
)


class QwenVLModel(VisionLanguageModel):
    """What the Qwen VL generations share, in front of their text model's class: the config's
    ``text_config`` flattened, M-RoPE in every layer, the vision tower, the checkpoint names,
    the multimodal declarations. A generation names its tower, rotary class, vision names and
    processor defaults."""

    gguf_architectures = ()
    position_axes = 3
    vision_tower: Any = Qwen2_5_VisionTower
    rotary_class: type[MRotaryEmbedding] = MRotaryEmbedding
    vision_names = staticmethod(vision_name_map)
    processor_defaults: Mapping[str, Any] = QWEN2_DEFAULTS
    # set by the text model's class or __init__ (annotations only: no class attribute)
    hf_architectures: tuple[str, ...]
    config: ArchConfig
    model: Any
    processor: ImageProcessor

    def __init__(self, config: ArchConfig | dict[str, Any], build: BuildContext) -> None:
        self._mrope: MRotaryEmbedding | None = None
        super().__init__(self.config_from_hf(dict(config)), build)  # type: ignore[call-arg]
        cfg = self.config
        vision = cfg.get("vision_config")
        if not isinstance(vision, Mapping):
            raise ValueError("model config: a vision_config object is required")
        out_key = self.vision_tower.out_key
        if int(vision.get(out_key, cfg.hidden_size)) != int(cfg.hidden_size):
            raise ValueError(
                f"model config: vision_config.{out_key} {vision.get(out_key)} "
                f"differs from hidden_size {cfg.hidden_size}"
            )
        self._image_token_id = int(cfg.require("image_token_id"))
        self.visual = self.vision_tower(vision, build)
        # the decoder's plain rotary table is never used: every layer rotates with M-RoPE
        assert self._mrope is not None
        self.model.rotary_emb = self._mrope
        self.processor = ImageProcessor(
            cfg.get("preprocessor_config"), vision, self.processor_defaults
        )

    @classmethod
    def config_from_hf(cls, config: dict[str, Any]) -> dict[str, Any]:
        """The ``text_config`` flattened into the config (the engine sizes the KV cache and
        the context from it), with ``vision_config`` and the image token ids kept."""
        text = config.get("text_config")
        if text is None:
            return config
        if not isinstance(text, Mapping):
            raise ValueError(
                f"model config: text_config must be an object, got {type(text).__name__}"
            )
        flat = {k: v for k, v in config.items() if k != "text_config"}
        for key, value in text.items():
            if key not in _OUTER_KEYS or key not in flat:
                flat[key] = value
        flat["architectures"] = list(config.get("architectures") or cls.hf_architectures)
        return flat

    def build_attention(
        self,
        config: ArchConfig,
        build: BuildContext,
        layer: int,
        rotary: RotaryEmbedding,
        head_dim: int,
        prefix: str,
    ) -> nn.Module:
        if self._mrope is None:
            self._mrope = self.rotary_class.from_config(config, head_dim, device=build.device)
        return super().build_attention(  # type: ignore[misc]
            config, build, layer, self._mrope, head_dim, prefix
        )

    def weight_names(self, naming: str) -> WeightNameMap:
        names = super().weight_names(naming)  # type: ignore[misc]
        if naming != "hf":
            return names  # type: ignore[no-any-return]
        return Qwen2VLNames(names, self.vision_names())  # type: ignore[return-value]

    def flatten_patch_embed(self, tensor: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        return tensor.reshape(tensor.shape[0], -1)

    # -- the multimodal declarations ----------------------------------------------------------
    @property
    def image_token_id(self) -> int:
        return self._image_token_id

    def process_image(self, image: Any) -> ProcessedImage:  # Any: a PIL image
        return self.processor.process(image)

    @torch.inference_mode()
    def encode_image(self, image: ProcessedImage) -> torch.Tensor:
        t, h, w = image.grid
        return self.visual(image.pixel_values, (t, h, w))

    def prompt_positions(
        self, token_ids: list[int], images: list[PlacedImage]
    ) -> tuple[torch.Tensor, int]:
        return mrope_positions(len(token_ids), images, self.processor.merge)

    # -- running ---------------------------------------------------------------------------
    def image_features(
        self, step: MultimodalStep | None
    ) -> tuple[MultimodalStep | None, list[torch.Tensor]]:
        """The step with the embeddings its image tokens take, and the features added to
        those tokens' hidden states after decoder layer 0, 1, ... (none here)."""
        return step, []

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        model = self.model
        step, features = self.image_features(current_multimodal_step())
        hidden = merge_multimodal_embeddings(model.embed_tokens(input_ids), step)
        residual = None
        for i, layer in enumerate(model.layers):
            hidden, residual = layer(positions, hidden, residual)
            if i < len(features):
                assert step is not None and step.rows is not None
                # added to the residual stream (the layer's output plus the deferred residual)
                hidden = hidden.index_add(0, step.rows, features[i].to(hidden.dtype))
        hidden, _ = model.norm(hidden, residual)
        return hidden


class Qwen2_5_VLForConditionalGeneration(QwenVLModel, Qwen2ForCausalLM):
    """Qwen2.5-VL: Qwen2 text model with M-RoPE, window-attention vision tower."""

    hf_architectures = ("Qwen2_5_VLForConditionalGeneration",)
    model_type = "qwen2_5_vl"


class Qwen2VLForConditionalGeneration(Qwen2_5_VLForConditionalGeneration):
    """Qwen2-VL: the same text model and positions, Qwen2-VL's vision tower."""

    hf_architectures = ("Qwen2VLForConditionalGeneration",)
    model_type = "qwen2_vl"
    vision_tower = Qwen2VisionTower


class Qwen3VLForConditionalGeneration(QwenVLModel, Qwen3ForCausalLM):
    """Qwen3-VL: Qwen3 text model with interleaved M-RoPE and DeepStack, Qwen3-VL's tower."""

    hf_architectures = ("Qwen3VLForConditionalGeneration",)
    model_type = "qwen3_vl"
    vision_tower = Qwen3VisionTower
    rotary_class = InterleavedMRotaryEmbedding
    vision_names = staticmethod(qwen3_vision_name_map)
    processor_defaults = QWEN3_DEFAULTS

    def image_features(
        self, step: MultimodalStep | None
    ) -> tuple[MultimodalStep | None, list[torch.Tensor]]:
        """The tower's output split: the image embeddings, then one DeepStack feature per
        listed vision block, each added after the decoder layer of its rank."""
        if step is None or step.embeds is None or step.rows is None:
            return step, []
        width = int(self.config.hidden_size)
        count = 1 + len(self.visual.deepstack)
        if step.embeds.shape[-1] != width * count:
            raise ValueError(
                f"image embeddings have width {step.embeds.shape[-1]}, expected "
                f"{count} x hidden_size {width}"
            )
        parts = step.embeds.split(width, dim=-1)
        return replace(step, embeds=parts[0]), list(parts[1:])
