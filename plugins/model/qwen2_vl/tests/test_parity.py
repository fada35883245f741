"""Parity with transformers' Qwen2_5_VLForConditionalGeneration (and
Qwen2VLForConditionalGeneration, Qwen3VLForConditionalGeneration) on the same random weights,
through the whole engine (``LLM.generate`` with images): the log-probabilities of the prompt's
text after the images, and 32 greedy tokens, with one and with two images."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tallow.engine.sampling.params import SamplingParams

STEPS = 32


def _prompt(kit: Any, text_parts: list[list[int]]) -> list[int]:
    """Text pieces with one image (start, placeholder, end) between consecutive pieces."""
    out = list(text_parts[0])
    for piece in text_parts[1:]:
        out += [kit.VISION_START, kit.IMAGE_TOKEN, kit.VISION_END] + list(piece)
    return out


def _hf_inputs(
    kit: Any, prompt: list[int], images: list[Any], preprocessor: dict[str, Any]
) -> dict[str, torch.Tensor]:
    """transformers' inputs: the placeholders expanded by its processor's grids."""
    from transformers import Qwen2VLImageProcessorPil

    IMAGE_TOKEN = kit.IMAGE_TOKEN
    settings = {k: v for k, v in preprocessor.items() if k != "image_processor_type"}
    proc = Qwen2VLImageProcessorPil(**settings)
    out = proc(images=images, return_tensors="pt")
    grids = out["image_grid_thw"]
    ids: list[int] = []
    n = 0
    for t in prompt:
        if t == IMAGE_TOKEN:
            ids += [IMAGE_TOKEN] * int(grids[n].prod() // 4)
            n += 1
        else:
            ids.append(t)
    input_ids = torch.tensor([ids])
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "pixel_values": out["pixel_values"],
        "image_grid_thw": grids,
        "mm_token_type_ids": (input_ids == IMAGE_TOKEN).int(),
    }


def _check(
    kit: Any, llm: Any, hf: Any, prompt: list[int], images: list[Any], preprocessor: dict[str, Any]
) -> None:
    inputs = _hf_inputs(kit, prompt, images, preprocessor)
    with torch.no_grad():
        ref_logits = hf(**inputs).logits[0].float()
        ref = hf.generate(**inputs, max_new_tokens=STEPS, do_sample=False)
    ref_tokens = ref[0, inputs["input_ids"].shape[1] :].tolist()
    ref_lp = torch.log_softmax(ref_logits, -1)

    params = SamplingParams(
        temperature=0.0, max_tokens=STEPS, ignore_eos=True, prompt_logprobs=0, logprobs=0
    )
    out = llm.generate(prompt, params, images=images)[0]
    ids = inputs["input_ids"][0].tolist()
    assert list(out.prompt_token_ids) == ids, "the engine expanded the images differently"
    last_image = max(i for i, t in enumerate(ids) if t == kit.IMAGE_TOKEN)
    # every text token after the last image: the logprob of the token given its prefix
    for p in range(last_image + 1, len(ids)):
        ours = out.prompt_logprobs[p][ids[p]].logprob
        assert ours == pytest.approx(float(ref_lp[p - 1, ids[p]]), abs=2e-4), f"position {p}"
    assert list(out.outputs[0].token_ids) == ref_tokens
    assert len(set(ref_tokens)) > 1, "degenerate model: greedy decoding repeats one token"


FAMILIES = {
    "qwen2.5-vl": ("checkpoint", "llm", "PREPROCESSOR"),
    "qwen2-vl": ("qwen2_checkpoint", "qwen2_llm", "PREPROCESSOR"),
    "qwen3-vl": ("qwen3_checkpoint", "qwen3_llm", "PREPROCESSOR3"),
}


def _family(kit: Any, request: Any, family: str) -> tuple[Any, Any, dict[str, Any]]:
    """(the transformers model, the engine, the preprocessor config) of ``family``."""
    checkpoint, llm, preprocessor = FAMILIES[family]
    hf, _ = request.getfixturevalue(checkpoint)
    return hf, request.getfixturevalue(llm), getattr(kit, preprocessor)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_one_image(kit, request, family) -> None:
    hf, llm, preprocessor = _family(kit, request, family)
    _check(
        kit,
        llm,
        hf,
        _prompt(kit, [[5, 17, 40], [88, 120, 9, 64, 33, 12]]),
        [kit.image(90, 60, seed=1)],
        preprocessor,
    )


@pytest.mark.parametrize("family", list(FAMILIES))
def test_two_images(kit, request, family) -> None:
    hf, llm, preprocessor = _family(kit, request, family)
    prompt = _prompt(kit, [[5, 17], [88, 120, 9], [64, 33, 12, 200, 7]])
    _check(
        kit,
        llm,
        hf,
        prompt,
        [kit.image(56, 112, seed=2), kit.image(150, 100, "RGBA", seed=3)],
        preprocessor,
    )


@pytest.mark.parametrize("family", list(FAMILIES))
def test_images_change_the_output(kit, request, family) -> None:
    """The same prompt with another image gives other logits (the tower is not ignored)."""
    _, llm, _ = _family(kit, request, family)
    prompt = _prompt(kit, [[5, 17, 40], [88, 120, 9, 64]])
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, prompt_logprobs=0)
    a = llm.generate(prompt, params, images=[kit.image(90, 60, seed=1)])[0]
    b = llm.generate(prompt, params, images=[kit.image(90, 60, seed=9)])[0]
    last = len(a.prompt_token_ids) - 1
    tok = a.prompt_token_ids[last]
    assert a.prompt_logprobs[last][tok].logprob != pytest.approx(
        b.prompt_logprobs[last][tok].logprob, abs=1e-4
    )
