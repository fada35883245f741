"""Images to patches, and the M-RoPE positions of a prompt.

Preprocessing is transformers' own ``Qwen2VLImageProcessor`` (its PIL implementation: no
torchvision needed), built from the checkpoint's ``preprocessor_config.json`` when it has one
(the loader puts it in the config as ``preprocessor_config``), else from the vision config's
patch sizes and the processor's defaults. An image is resized to multiples of
``patch_size * merge_size`` within ``min_pixels .. max_pixels``, normalized, and cut into
patches; it expands to ``t * h * w / merge_size²`` placeholder tokens.

Positions (transformers' ``get_rope_index`` for images): text tokens count up on all three
axes; an image's tokens take the temporal position where the image starts (plus the frame index,
0 for a still image), and their row and column on the other two axes offset by the same start; the text after it continues from
``start + max(rows, columns)``. Past the prompt, positions are the token's index plus
``delta = max position + 1 - prompt length``.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch

from tallow.layers import PlacedImage, ProcessedImage

#: transformers' defaults for Qwen2-VL / Qwen2.5-VL processors
DEFAULT_MIN_PIXELS = 56 * 56
DEFAULT_MAX_PIXELS = 28 * 28 * 1280
#: what a checkpoint without ``preprocessor_config.json`` is processed with
QWEN2_DEFAULTS: Mapping[str, Any] = {
    "min_pixels": DEFAULT_MIN_PIXELS,
    "max_pixels": DEFAULT_MAX_PIXELS,
}
#: Qwen3-VL's published preprocessor config: its pixel limits and a mean and std of 0.5
QWEN3_DEFAULTS: Mapping[str, Any] = {
    "size": {"shortest_edge": 65536, "longest_edge": 16777216},
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
}


def hf_image_processor(
    preprocessor: Mapping[str, Any] | None,
    vision: Mapping[str, Any],
    defaults: Mapping[str, Any] = QWEN2_DEFAULTS,
) -> Any:
    """transformers' Qwen2-VL image processor for a checkpoint (Qwen3-VL's checkpoints name
    the same processor); ``defaults`` fill what the preprocessor config leaves out."""
    from transformers import Qwen2VLImageProcessorPil

    settings = dict(preprocessor or {})
    for key in ("image_processor_type", "processor_class", "auto_map"):
        settings.pop(key, None)
    settings.setdefault("patch_size", int(vision.get("patch_size", 14)))
    settings.setdefault("temporal_patch_size", int(vision.get("temporal_patch_size", 2)))
    settings.setdefault("merge_size", int(vision.get("spatial_merge_size", 2)))
    # a config's own limits win over every default limit ("size" and the pixel counts are
    # two ways of saying the same)
    has_size = "size" in settings
    has_pixels = "min_pixels" in settings or "max_pixels" in settings
    for key, value in defaults.items():
        if (key == "size" and (has_size or has_pixels)) or (
            key in ("min_pixels", "max_pixels") and has_size
        ):
            continue
        settings.setdefault(key, value)
    return Qwen2VLImageProcessorPil(**settings)


class ImageProcessor:
    """``process(image) -> ProcessedImage`` for one checkpoint."""

    def __init__(
        self,
        preprocessor: Mapping[str, Any] | None,
        vision: Mapping[str, Any],
        defaults: Mapping[str, Any] = QWEN2_DEFAULTS,
    ) -> None:
        self.hf = hf_image_processor(preprocessor, vision, defaults)
        self.merge = int(self.hf.merge_size)

    def process(self, image: Any) -> ProcessedImage:  # Any: a PIL image
        out = self.hf(images=[image], return_tensors="pt")
        grid = tuple(int(g) for g in out["image_grid_thw"][0].tolist())
        t, h, w = grid
        return ProcessedImage(
            pixel_values=out["pixel_values"],
            grid=grid,
            num_tokens=t * h * w // (self.merge * self.merge),
        )


def mrope_positions(length: int, images: list[PlacedImage], merge: int) -> tuple[torch.Tensor, int]:
    """``([3, length] int64, delta)`` for a prompt of ``length`` tokens holding ``images``
    (in order, placeholders expanded)."""
    pieces: list[torch.Tensor] = []
    at = 0  # next prompt index
    pos = 0  # next text position
    for placed in images:
        if placed.offset < at:
            raise ValueError("images overlap or are out of order in the prompt")
        text = placed.offset - at
        pieces.append(torch.arange(pos, pos + text).expand(3, -1))
        pos += text
        t, h, w = placed.image.grid
        gh, gw = h // merge, w // merge
        tt, hh, ww = torch.meshgrid(
            torch.arange(t), torch.arange(gh), torch.arange(gw), indexing="ij"
        )
        pieces.append(torch.stack([tt, hh, ww]).reshape(3, -1) + pos)
        pos += max(gh, gw)
        at = placed.end
    pieces.append(torch.arange(pos, pos + length - at).expand(3, -1))
    positions = torch.cat(pieces, dim=1).to(torch.int64)
    if positions.shape[1] != length:
        raise ValueError(f"the images' tokens do not fit a prompt of {length} tokens")
    delta = int(positions.max()) + 1 - length if length else 0
    return positions, delta
