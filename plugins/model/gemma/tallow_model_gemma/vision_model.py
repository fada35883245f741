"""Gemma 3 with its vision tower: images in, text out (``Gemma3ForConditionalGeneration``).

The text model is :class:`tallow_model_gemma.model.Gemma3ForConditionalGeneration` (the checkpoint's
``text_config``); the SigLIP tower and the projector are :mod:`tallow_model_gemma.siglip`, the
preprocessing :mod:`tallow_model_gemma.image_processor`.

A prompt holds one begin-of-image token (``boi_token_index``, ``<start_of_image>``, what
Gemma 3's chat template renders for an image part) per image. The engine expands each into
what transformers' ``Gemma3Processor`` puts in its place, ``"\\n\\n"``, begin-of-image,
``mm_tokens_per_image`` image tokens (``image_token_index``), end-of-image, ``"\\n\\n"``
(:meth:`expand_image`); ``"\\n\\n"`` is one token of Gemma 3's vocabulary, id 108
(``double_newline_token_id`` in the config overrides it). The image tokens' embeddings are the
encoder's output, unscaled (the text embeddings are multiplied by ``sqrt(hidden)``, as in the
text model), and they attend to each other bidirectionally
(:mod:`tallow_model_gemma.image_attention`), so the model declares ``whole_images``: the scheduler
never ends a prefill chunk inside an image. Positions stay 1-D.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import torch

from tallow.layers import (
    ArchConfig,
    Attention,
    BuildContext,
    ProcessedImage,
    VisionLanguageModel,
    WeightNameMap,
    current_multimodal_step,
    merge_multimodal_embeddings,
)

from . import model as text
from .image_attention import ImageBlockAttention
from .image_processor import ImageProcessor
from .naming import VisionModelNames
from .siglip import Gemma3VisionTower

#: ``"\n\n"`` in Gemma 3's tokenizer
DOUBLE_NEWLINE = 108

#: what only the outer config of a multimodal checkpoint states about images
_VISION_KEYS = (
    "vision_config",
    "mm_tokens_per_image",
    "boi_token_index",
    "eoi_token_index",
    "image_token_index",
    "image_token_id",
    "preprocessor_config",
    "double_newline_token_id",
)


class Gemma3ForConditionalGeneration(text.Gemma3ForConditionalGeneration, VisionLanguageModel):
    """Gemma 3 text model, SigLIP vision tower, average-pool projector."""

    #: an image's tokens attend to each other: the scheduler computes each image in one step
    whole_images = True

    def __init__(self, config: ArchConfig | dict[str, Any], build: BuildContext) -> None:
        super().__init__(config, build)
        cfg = self.config
        vision = cfg.get("vision_config")
        if not isinstance(vision, Mapping):
            raise ValueError(
                "model config: a Gemma3ForConditionalGeneration config needs a "
                "'vision_config' object for its vision tower"
            )
        self.tokens_per_image = int(cfg.get("mm_tokens_per_image") or 256)
        image_token = cfg.get("image_token_index", cfg.get("image_token_id"))
        self._image_token_id = int(262144 if image_token is None else image_token)
        self.boi_token_id = int(cfg.get("boi_token_index") or 255999)
        self.eoi_token_id = int(cfg.get("eoi_token_index") or 256000)
        self.newline_token_id = int(cfg.get("double_newline_token_id") or DOUBLE_NEWLINE)
        vocab = int(cfg.vocab_size)
        for name, value in (
            ("image_token_index", self._image_token_id),
            ("boi_token_index", self.boi_token_id),
            ("eoi_token_index", self.eoi_token_id),
            ("double_newline_token_id", self.newline_token_id),
        ):
            if not 0 <= value < vocab:
                raise ValueError(
                    f"model config: {name} {value} is outside the vocabulary (vocab_size {vocab})"
                )
        self.vision_tower = Gemma3VisionTower(
            vision, int(cfg.hidden_size), self.tokens_per_image, build
        )
        self.processor = ImageProcessor(
            cfg.get("preprocessor_config"), vision, self.tokens_per_image
        )
        for layer in self.model.layers:
            attention = cast(text.GemmaAttention, layer.self_attn)
            attention.attn = ImageBlockAttention(cast(Attention, attention.attn))

    @classmethod
    def config_from_hf(cls, config: dict[str, Any]) -> dict[str, Any]:
        """The text model's config (see the text class) with the outer config's vision
        settings kept."""
        flat = super().config_from_hf(config)
        for key in _VISION_KEYS:
            if key in config and key not in flat:
                flat[key] = config[key]
        return flat

    def weight_names(self, naming: str) -> WeightNameMap:
        names = text.Gemma3ForCausalLM.weight_names(self, naming)
        return VisionModelNames(names) if naming == "hf" else names  # type: ignore[return-value]

    def flatten_patch_embed(self, tensor: torch.Tensor, groups: dict[str, str]) -> torch.Tensor:
        return tensor.reshape(tensor.shape[0], -1)

    # -- the multimodal declarations ----------------------------------------------------------
    @property
    def image_token_id(self) -> int:
        return self._image_token_id

    @property
    def placeholder_token_id(self) -> int:
        return self.boi_token_id

    def expand_image(self, image: ProcessedImage) -> tuple[list[int], int]:
        nl = self.newline_token_id
        return (
            [nl, self.boi_token_id]
            + [self._image_token_id] * image.num_tokens
            + [self.eoi_token_id, nl],
            2,
        )

    def process_image(self, image: Any) -> ProcessedImage:  # Any: a PIL image
        return self.processor.process(image)

    @torch.inference_mode()
    def encode_image(self, image: ProcessedImage) -> torch.Tensor:
        return self.vision_tower(image.pixel_values)

    # -- running ---------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        model = self.model
        hidden = merge_multimodal_embeddings(
            model.embed_tokens(input_ids) * model.normalizer, current_multimodal_step()
        )
        residual = None
        for layer in model.layers:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = model.norm(hidden, residual)
        return hidden
