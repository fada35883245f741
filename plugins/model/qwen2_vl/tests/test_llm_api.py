"""``LLM.chat`` and ``LLM.generate`` take images as PIL images, paths, bytes and data: URLs,
and all give the same tokens for the same pixels."""

from __future__ import annotations

import base64
import io
from typing import Any

import pytest

from tallow.engine.sampling.params import SamplingParams

PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def _png(img: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def test_every_image_form_gives_the_same_tokens(kit, llm, tmp_path) -> None:
    img = kit.image(80, 120, seed=41)
    path = tmp_path / "img.png"
    path.write_bytes(_png(img))
    prompt = [5, 6, kit.VISION_START, kit.IMAGE_TOKEN, kit.VISION_END, 7, 8]
    ref = llm.generate(prompt, PARAMS, images=[img])[0].outputs[0].token_ids
    assert llm.generate(prompt, PARAMS, images=[str(path)])[0].outputs[0].token_ids == ref
    assert llm.generate(prompt, PARAMS, images=[_png(img)])[0].outputs[0].token_ids == ref

    url = "data:image/png;base64," + base64.b64encode(_png(img)).decode()
    text = [{"type": "text", "text": "w5 w6"}, None, {"type": "text", "text": "w7 w8"}]
    for part in (
        {"type": "image", "image": img},
        {"type": "image", "image": path},
        {"type": "image_url", "image_url": {"url": url}},
    ):
        messages = [{"role": "user", "content": [text[0], part, text[2]]}]
        out = llm.chat(messages, PARAMS)[0]
        assert out.outputs[0].token_ids == ref, part["type"]


def test_a_batch_of_prompts_with_their_own_images(kit, llm) -> None:
    a, b = kit.image(80, 120, seed=42), kit.image(100, 50, seed=43)
    one = [5, kit.VISION_START, kit.IMAGE_TOKEN, kit.VISION_END, 7]
    two = [
        6,
        kit.VISION_START,
        kit.IMAGE_TOKEN,
        kit.VISION_END,
        kit.VISION_START,
        kit.IMAGE_TOKEN,
        kit.VISION_END,
        8,
    ]
    batch = llm.generate([one, two, [9, 10]], PARAMS, images=[[a], [b, a], None])
    assert (
        batch[0].outputs[0].token_ids
        == llm.generate(one, PARAMS, images=[a])[0].outputs[0].token_ids
    )
    assert (
        batch[1].outputs[0].token_ids
        == llm.generate(two, PARAMS, images=[b, a])[0].outputs[0].token_ids
    )
    assert batch[2].outputs[0].token_ids == llm.generate([9, 10], PARAMS)[0].outputs[0].token_ids
    with pytest.raises(ValueError, match="2 lists of images for 3 prompts"):
        llm.generate([one, two, [9]], PARAMS, images=[[a], [b, a]])
