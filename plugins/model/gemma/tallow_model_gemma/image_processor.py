"""Images to pixels for Gemma 3's vision tower.

Preprocessing is transformers' own ``Gemma3ImageProcessor`` (its PIL implementation: no
torchvision needed), built from the checkpoint's ``preprocessor_config.json`` when it has one
(the loader puts it in the config as ``preprocessor_config``), else from the vision config's
``image_size`` and the processor's defaults: the image is converted to RGB, resized to
``image_size × image_size`` (bilinear), rescaled and normalized (mean and std 0.5). A null
``do_convert_rgb`` (as hub configs have it) converts to RGB. Every image
becomes ``mm_tokens_per_image`` tokens. Pan-and-scan (extra crops of wide images, announced by
text in the prompt) is not supported: a preprocessor config that turns it on is refused.
"""

from __future__ import annotations

from typing import Any, Mapping

from tallow.layers import ProcessedImage


def hf_image_processor(preprocessor: Mapping[str, Any] | None, vision: Mapping[str, Any]) -> Any:
    """transformers' Gemma 3 image processor for a checkpoint."""
    from transformers import Gemma3ImageProcessorPil

    settings = dict(preprocessor or {})
    for key in ("image_processor_type", "processor_class", "auto_map"):
        settings.pop(key, None)
    if settings.get("do_pan_and_scan"):
        raise ValueError(
            "preprocessor_config.json: do_pan_and_scan is true; tallow runs Gemma 3 "
            "images without pan-and-scan crops (set it to false)"
        )
    settings["do_pan_and_scan"] = False
    # hub configs say null, which transformers takes as "do not convert" and then fails on
    # RGBA, grayscale and palette images; the tower takes RGB
    if settings.get("do_convert_rgb") is None:
        settings["do_convert_rgb"] = True
    if "size" not in settings:
        side = int(vision.get("image_size") or 896)
        settings["size"] = {"height": side, "width": side}
    return Gemma3ImageProcessorPil(**settings)


class ImageProcessor:
    """``process(image) -> ProcessedImage`` for one checkpoint."""

    def __init__(
        self,
        preprocessor: Mapping[str, Any] | None,
        vision: Mapping[str, Any],
        tokens_per_image: int,
    ) -> None:
        self.hf = hf_image_processor(preprocessor, vision)
        self.tokens_per_image = int(tokens_per_image)
        side = int(vision.get("image_size") or 896)
        size = self.hf.size
        got = (int(size["height"]), int(size["width"]))
        if got != (side, side):
            raise ValueError(
                f"preprocessor_config.json: size {got} differs from the vision "
                f"tower's image_size {side}"
            )

    def process(self, image: Any) -> ProcessedImage:  # Any: a PIL image
        out = self.hf(images=[image], return_tensors="pt")
        pixels = out["pixel_values"]
        if pixels.shape[0] != 1:
            raise ValueError(
                f"the image processor made {pixels.shape[0]} crops of one image; "
                "expected one (pan-and-scan is off)"
            )
        return ProcessedImage(
            pixel_values=pixels[0], grid=tuple(pixels.shape[-2:]), num_tokens=self.tokens_per_image
        )
