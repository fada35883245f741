"""The model side of the multimodal seam: what a vision-language model declares, and the
per-step inputs the engine hands its forward.

A model that takes images subclasses :class:`VisionLanguageModel` (beside its
:class:`~tallow.layers.CausalLM` base) and implements:

* ``image_token_id``: the placeholder token an image's positions carry in the prompt;
* optionally ``placeholder_token_id`` and ``expand_image``: the token that stands for an image
  in the prompt before expansion (default: ``image_token_id``) and what it expands to (default:
  ``num_tokens`` copies of ``image_token_id``; Gemma 3 wraps them in begin/end-of-image tokens);
* ``process_image(image) -> ProcessedImage``: a PIL image to the tensors its encoder takes and
  the number of placeholder tokens the image expands to (pure host work: the engine runs it
  off the device thread);
* ``encode_image(image) -> Tensor [num_tokens, hidden]``: the vision tower and projector;
* ``prompt_positions(token_ids, images)``: the rotary positions of a prompt whose images are
  expanded, ``[axes, len]``, and the offset ``delta`` that positions after the prompt add to
  their index (Qwen2-VL's M-RoPE: three axes; text continues after the largest position + 1).
  Models with plain 1-D positions leave ``position_axes`` at 1 and do not override it.

During a step the engine sets a :class:`MultimodalStep` (:func:`multimodal_step`): the encoder
embeddings of the image tokens the step computes and their rows in the flat batch, and, for a
model with several position axes, every row's positions. The model reads it with
:func:`current_multimodal_step` and scatters the embeddings with
:func:`merge_multimodal_embeddings`.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import torch

if TYPE_CHECKING:  # pragma: no cover
    from PIL.Image import Image

__all__ = [
    "ProcessedImage",
    "PlacedImage",
    "VisionLanguageModel",
    "MultimodalStep",
    "multimodal_step",
    "current_multimodal_step",
    "merge_multimodal_embeddings",
]


@dataclass(frozen=True)
class ProcessedImage:
    """An image as a model's encoder takes it."""

    #: the encoder's input (Qwen2-VL: flattened patches ``[patches, C * T * P * P]``), host
    pixel_values: torch.Tensor
    #: the model's grid of the image (Qwen2-VL: ``(t, h, w)`` in patches)
    grid: tuple[int, ...]
    #: how many placeholder tokens the image expands to in the prompt
    num_tokens: int


@dataclass(frozen=True)
class PlacedImage:
    """An image inside an expanded prompt: its tokens are ``offset .. offset + num_tokens``."""

    offset: int
    image: ProcessedImage

    @property
    def end(self) -> int:
        return self.offset + self.image.num_tokens


class VisionLanguageModel:
    """The declarations of a model that takes images (see the module docstring)."""

    #: rotary position axes per token (3 for M-RoPE); 1: the engine's 1-D positions
    position_axes: int = 1
    #: an image's tokens attend to each other (Gemma 3): the scheduler computes each image's
    #: tokens in one step, never ending a prefill chunk inside an image
    whole_images: bool = False

    @property
    def image_token_id(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} must define image_token_id")

    @property
    def placeholder_token_id(self) -> int:
        """The token that stands for one image in a prompt before expansion."""
        return self.image_token_id

    def expand_image(self, image: ProcessedImage) -> tuple[list[int], int]:
        """(the tokens that replace an image's placeholder, the index among them where the
        image's ``num_tokens`` encoder tokens start)."""
        return [self.image_token_id] * image.num_tokens, 0

    def process_image(self, image: "Image") -> ProcessedImage:
        raise NotImplementedError(f"{type(self).__name__} must implement process_image")

    def encode_image(self, image: ProcessedImage) -> torch.Tensor:
        raise NotImplementedError(f"{type(self).__name__} must implement encode_image")

    def prompt_positions(
        self, token_ids: list[int], images: list[PlacedImage]
    ) -> tuple[torch.Tensor, int]:
        """``([position_axes, len(token_ids)] int64, delta)``; the default is 1-D positions
        ``0 .. len - 1`` and no offset."""
        return torch.arange(len(token_ids), dtype=torch.int64).unsqueeze(0), 0


@dataclass
class MultimodalStep:
    """What one step gives a vision-language model besides token ids and 1-D positions."""

    #: encoder outputs of the image tokens the step computes ``[k, hidden]``, or None
    embeds: torch.Tensor | None = None
    #: their rows in the flat batch ``[k]`` (int64, on the model's device), or None
    rows: torch.Tensor | None = None
    #: every row's positions ``[position_axes, num_tokens]`` (int64), or None (use the 1-D
    #: positions on every axis)
    positions: torch.Tensor | None = None


_steps: list[MultimodalStep] = []


@contextmanager
def multimodal_step(step: MultimodalStep | None) -> Iterator[None]:
    """Make ``step`` visible to the model during one forward (None: a step without it)."""
    if step is None:
        yield
        return
    _steps.append(step)
    try:
        yield
    finally:
        _steps.pop()


def current_multimodal_step() -> MultimodalStep | None:
    """The step's multimodal inputs, or None when it has none."""
    return _steps[-1] if _steps else None


def merge_multimodal_embeddings(embeds: torch.Tensor, step: MultimodalStep | None) -> torch.Tensor:
    """``embeds`` ``[num_tokens, hidden]`` with the rows of ``step``'s image tokens replaced by
    their encoder embeddings."""
    if step is None or step.embeds is None or step.rows is None:
        return embeds
    if step.embeds.shape[-1] != embeds.shape[-1]:
        raise ValueError(
            f"encoder embeddings have width {step.embeds.shape[-1]}, the token "
            f"embeddings {embeds.shape[-1]}"
        )
    return embeds.index_copy(0, step.rows, step.embeds.to(embeds.dtype))
