"""Image preprocessing is transformers' Gemma3ImageProcessor (PIL implementation), reused
directly: on ten images of varied sizes and modes the pixels equal the processor's, with the
checkpoint's preprocessor_config.json and without one (the vision config's image_size); every
image is ``mm_tokens_per_image`` tokens; pan-and-scan is refused. A null ``do_convert_rgb``
(hub configs) converts to RGB, so RGBA, grayscale and palette images work."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers", reason="transformers is the oracle")

from tallow_model_gemma.image_processor import ImageProcessor  # noqa: E402

CASES = [  # (width, height, mode)
    (90, 60, "RGB"),
    (150, 100, "RGBA"),
    (64, 64, "L"),
    (120, 80, "P"),
    (8, 8, "RGB"),
    (600, 40, "RGB"),
    (30, 500, "RGB"),
    (333, 222, "RGBA"),
    (57, 91, "L"),
    (1000, 1000, "RGB"),
]
VISION = {"image_size": 896, "patch_size": 14}


def _image(width: int, height: int, mode: str, seed: int) -> Any:
    from PIL import Image

    rng = np.random.default_rng(seed)
    rgb = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")
    if mode == "P":
        return rgb.convert("P", palette=Image.Palette.ADAPTIVE)
    return rgb if mode == "RGB" else rgb.convert(mode)


@pytest.mark.parametrize("width,height,mode", CASES)
def test_pixels_equal_transformers(width, height, mode) -> None:
    from transformers import Gemma3ImageProcessorPil

    img = _image(width, height, mode, seed=width + height)
    # a hub checkpoint's preprocessor_config.json (google/gemma-3-4b-it's values)
    config = {
        "image_processor_type": "Gemma3ImageProcessor",
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "do_convert_rgb": None,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "resample": 2,
        "rescale_factor": 1 / 255,
        "size": {"height": 896, "width": 896},
        "do_pan_and_scan": None,
        "pan_and_scan_max_num_crops": 4,
        "pan_and_scan_min_crop_size": 256,
        "pan_and_scan_min_ratio_to_activate": 1.2,
    }
    ours = ImageProcessor(config, VISION, 256).process(img)
    settings = {k: v for k, v in config.items() if k != "image_processor_type"}
    settings["do_convert_rgb"] = True  # null in the file: converted (transformers would fail)
    ref = Gemma3ImageProcessorPil(**settings)(images=[img], return_tensors="pt")
    assert ours.pixel_values.shape == (3, 896, 896)
    assert torch.equal(ours.pixel_values, ref["pixel_values"][0])
    assert ours.num_tokens == 256


def test_defaults_without_preprocessor_config() -> None:
    """Without preprocessor_config.json: the processor's defaults at the tower's image_size."""
    from transformers import Gemma3ImageProcessorPil

    img = _image(700, 300, "RGB", seed=4)
    got = ImageProcessor(None, {"image_size": 84}, 9).process(img)
    want = Gemma3ImageProcessorPil(size={"height": 84, "width": 84})(
        images=[img], return_tensors="pt"
    )
    assert torch.equal(got.pixel_values, want["pixel_values"][0])
    assert got.num_tokens == 9


def test_pan_and_scan_is_refused() -> None:
    with pytest.raises(ValueError, match="do_pan_and_scan"):
        ImageProcessor({"do_pan_and_scan": True}, VISION, 256)


def test_size_must_match_the_tower() -> None:
    with pytest.raises(ValueError, match="image_size 896"):
        ImageProcessor({"size": {"height": 448, "width": 448}}, VISION, 256)
