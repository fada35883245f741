"""Image preprocessing is transformers' Qwen2VLImageProcessor (PIL implementation), reused
directly and built from the checkpoint's preprocessor_config.json (Qwen2.5-VL's form, and
Qwen3-VL's: 16-pixel patches, limits given as ``size``, mean and std 0.5): on ten images of varied
sizes and modes the model's pixels and grids equal the processor's, and each image expands to
``t * h * w / merge²`` placeholder tokens, the count transformers' processor inserts."""

from __future__ import annotations

from typing import Any

import pytest
import torch

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


def _reference(kit: Any, preprocessor: str = "PREPROCESSOR") -> Any:
    from transformers import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        **{k: v for k, v in getattr(kit, preprocessor).items() if k != "image_processor_type"}
    )


#: family → (the engine fixture, the kit's preprocessor config)
FAMILIES = {"qwen2.5-vl": ("llm", "PREPROCESSOR"), "qwen3-vl": ("qwen3_llm", "PREPROCESSOR3")}


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("width,height,mode", CASES)
def test_pixels_and_grid_equal_transformers(kit, request, family, width, height, mode) -> None:
    engine, preprocessor = FAMILIES[family]
    model = request.getfixturevalue(engine).engine.images.model
    img = kit.image(width, height, mode, seed=width + height)
    ours = model.process_image(img)
    ref = _reference(kit, preprocessor)(images=[img], return_tensors="pt")
    grid = tuple(ref["image_grid_thw"][0].tolist())
    assert ours.grid == grid
    assert torch.equal(ours.pixel_values, ref["pixel_values"])
    assert ours.num_tokens == grid[0] * grid[1] * grid[2] // 4
    # the limits of preprocessor_config.json hold: at most 36 merged tokens
    assert 1 <= ours.num_tokens <= 36


def test_expansion_matches_the_grid(kit, llm) -> None:
    """The engine's expanded prompt holds exactly the processor's count per image."""
    images = [kit.image(w, h, m) for w, h, m in CASES[:3]]
    prompt = [5] + [kit.VISION_START, kit.IMAGE_TOKEN, kit.VISION_END] * 3 + [6]
    ids, mm = llm.engine.expand_images(prompt, images)
    ref = _reference(kit)(images=images, return_tensors="pt")["image_grid_thw"]
    counts = [int(g.prod()) // 4 for g in ref]
    assert ids.count(kit.IMAGE_TOKEN) == sum(counts)
    assert [im.processed.num_tokens for im in mm.images] == counts
    assert mm.positions.shape == (3, len(ids))


def test_defaults_without_preprocessor_config(kit) -> None:
    """A checkpoint without preprocessor_config.json gets the processor's default limits and
    the vision config's patch sizes."""
    from transformers import Qwen2VLImageProcessorPil

    from tallow_model_qwen2_vl.processor import ImageProcessor

    ours = ImageProcessor(
        None, {"patch_size": 14, "temporal_patch_size": 2, "spatial_merge_size": 2}
    )
    ref = Qwen2VLImageProcessorPil()
    img = kit.image(1000, 700)
    got = ours.process(img)
    want = ref(images=[img], return_tensors="pt")
    assert got.grid == tuple(want["image_grid_thw"][0].tolist())
    assert torch.equal(got.pixel_values, want["pixel_values"])


def test_qwen3_defaults_without_preprocessor_config(kit) -> None:
    """A Qwen3-VL checkpoint without preprocessor_config.json gets its published processor
    settings (pixel limits as ``size``, mean and std 0.5) and the vision config's 16-pixel
    patches; a config that states only pixel counts keeps them."""
    from transformers import Qwen2VLImageProcessorPil

    from tallow_model_qwen2_vl.processor import QWEN3_DEFAULTS, ImageProcessor

    vision = {"patch_size": 16, "temporal_patch_size": 2, "spatial_merge_size": 2}
    published = Qwen2VLImageProcessorPil(
        size={"shortest_edge": 65536, "longest_edge": 16777216},
        patch_size=16,
        temporal_patch_size=2,
        merge_size=2,
        image_mean=[0.5] * 3,
        image_std=[0.5] * 3,
    )
    img = kit.image(1000, 700, "RGBA")
    got = ImageProcessor(None, vision, QWEN3_DEFAULTS).process(img)
    want = published(images=[img], return_tensors="pt")
    assert got.grid == tuple(want["image_grid_thw"][0].tolist())
    assert torch.equal(got.pixel_values, want["pixel_values"])
    small = ImageProcessor(
        {"min_pixels": 32 * 32 * 4, "max_pixels": 32 * 32 * 16}, vision, QWEN3_DEFAULTS
    )
    assert small.process(img).num_tokens <= 16
