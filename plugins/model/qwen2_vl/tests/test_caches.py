"""Images through the engine's caches: the prefix cache shares the blocks of two requests with
the same image and never those of requests with different images behind the same placeholder
ids; the encoder cache serves an image seen before; chunked prefill with chunk boundaries
inside an image's tokens gives the unchunked tokens."""

from __future__ import annotations

from typing import Any

import pytest

from tallow.engine.sampling.params import SamplingParams

PREFIX = [3 + i for i in range(20)]  # the image starts inside the second 16-token block
SUFFIX = [40, 41, 42, 43, 44]


def _prompt(kit: Any, prefix: list[int] = PREFIX) -> list[int]:
    return prefix + [kit.VISION_START, kit.IMAGE_TOKEN, kit.VISION_END] + SUFFIX


def _run(llm: Any, prompt: list[int], image: Any) -> Any:
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    return llm.generate(prompt, params, images=[image])[0]


@pytest.fixture
def fresh_llm(checkpoint: tuple[Any, Any]) -> Any:
    from tallow.plugin.testing.engine import offline_llm

    return offline_llm(
        str(checkpoint[1]),
        plugins=["tallow-model-qwen2-vl", "tallow-model-llama", "tallow-format-safetensors"],
        config={
            "model": {"dtype": "float32", "max_model_len": 256},
            "cache": {"num_blocks": 64, "block_size": 16},
        },
    )


def test_same_image_shares_blocks_and_encoder_output(kit, fresh_llm) -> None:
    llm = fresh_llm
    a, b = kit.image(200, 140, seed=11), kit.image(200, 140, seed=12)
    first = _run(llm, _prompt(kit), a)
    stats = llm.engine.stats()
    assert stats["images_encoded"] == 1 and first.num_cached_tokens == 0
    length = len(first.prompt_token_ids)
    assert length > 48, "the image should span several blocks"

    # the same prompt and image: every full block is shared, the image is not encoded again
    again = _run(llm, _prompt(kit), kit.image(200, 140, seed=11))  # equal pixels, new object
    assert again.num_cached_tokens == (length - 1) // 16 * 16
    assert list(again.outputs[0].token_ids) == list(first.outputs[0].token_ids)
    assert llm.engine.stats()["images_encoded"] == 1

    # another image behind the same placeholder ids: only the text-only first block is shared
    other = _run(llm, _prompt(kit), b)
    assert other.prompt_token_ids == first.prompt_token_ids  # same ids, different pixels
    assert other.num_cached_tokens == 16
    stats = llm.engine.stats()
    assert stats["images_encoded"] == 2

    # the first image after another text: no prefix block in common, the encoder cache hits
    hits = stats["encoder_cache_hits"]
    moved = _run(llm, _prompt(kit, [7] * 20), a)
    stats = llm.engine.stats()
    assert moved.num_cached_tokens == 0
    assert stats["images_encoded"] == 2 and stats["encoder_cache_hits"] == hits + 1
    assert stats["encoder_cache_bytes"] > 0


def test_chunk_boundaries_inside_an_image(kit, checkpoint, llm) -> None:
    """Chunks of 7 tokens cut the image's tokens several times: same tokens and prompt
    logprobs as one whole prefill."""
    from tallow.plugin.testing.engine import offline_llm

    chunked = offline_llm(
        str(checkpoint[1]),
        plugins=["tallow-model-qwen2-vl", "tallow-model-llama", "tallow-format-safetensors"],
        config={
            "model": {"dtype": "float32", "max_model_len": 256},
            "cache": {"num_blocks": 64, "block_size": 16, "enable_prefix_caching": False},
            "scheduler": {"prefill_chunk_size": 7},
        },
    )
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, prompt_logprobs=0)
    image = kit.image(200, 140, seed=21)
    whole = llm.generate(_prompt(kit), params, images=[image])[0]
    parts = chunked.generate(_prompt(kit), params, images=[image])[0]
    assert list(parts.outputs[0].token_ids) == list(whole.outputs[0].token_ids)
    for p in range(1, len(whole.prompt_token_ids)):
        tok = whole.prompt_token_ids[p]
        assert parts.prompt_logprobs[p][tok].logprob == pytest.approx(
            whole.prompt_logprobs[p][tok].logprob, abs=1e-4
        )
    # the encoder ran once for the image although several chunks took its tokens
    assert chunked.engine.stats()["images_encoded"] == 1


def test_placeholder_count_must_match_the_images(kit, llm) -> None:
    from tallow.engine.errors import AdmissionError

    params = SamplingParams(max_tokens=1)
    with pytest.raises(AdmissionError, match="1 image placeholder token.*2 image"):
        llm.generate(_prompt(kit), params, images=[kit.image(60, 60), kit.image(60, 60)])
    with pytest.raises(AdmissionError, match="images\\[0\\]: not a readable image"):
        llm.generate(_prompt(kit), params, images=[b"not an image"])
