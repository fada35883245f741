"""A batch mixing requests with images and a text-only one (CPU; Qwen2.5-VL and Qwen3-VL),
and on a GPU: the engine with Triton attention and CUDA graphs serves a batch mixing requests
with images (eager steps: M-RoPE positions and embeddings) and a text-only one, each with
transformers' greedy tokens on the CPU; the 7B-shaped random model encodes a 1024x1024 image."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tallow.engine.sampling.params import SamplingParams

STEPS = 16


#: family → (the checkpoint fixture, the engine fixture, the kit's preprocessor config)
FAMILIES = {
    "qwen2.5-vl": ("checkpoint", "llm", "PREPROCESSOR"),
    "qwen3-vl": ("qwen3_checkpoint", "qwen3_llm", "PREPROCESSOR3"),
}


def _hf_tokens(
    kit: Any, hf: Any, prompt: list[int], images: list[Any], preprocessor: str = "PREPROCESSOR"
) -> list[int]:
    from transformers import Qwen2VLImageProcessorPil

    kwargs: dict[str, Any] = {}
    ids = list(prompt)
    if images:
        proc = Qwen2VLImageProcessorPil(
            **{k: v for k, v in getattr(kit, preprocessor).items() if k != "image_processor_type"}
        )
        out = proc(images=images, return_tensors="pt")
        grids = iter(out["image_grid_thw"])
        ids = []
        for t in prompt:
            ids += [t] * (int(next(grids).prod()) // 4) if t == kit.IMAGE_TOKEN else [t]
        kwargs = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
    x = torch.tensor([ids])
    kwargs["mm_token_type_ids"] = (x == kit.IMAGE_TOKEN).int()
    with torch.no_grad():
        gen = hf.generate(
            input_ids=x,
            attention_mask=torch.ones_like(x),
            max_new_tokens=STEPS,
            do_sample=False,
            **kwargs,
        )
    return gen[0, x.shape[1] :].tolist()


def _mixed_batch(kit: Any) -> tuple[list[list[int]], list[Any]]:
    v = [kit.VISION_START, kit.IMAGE_TOKEN, kit.VISION_END]
    prompts = [[5, 17] + v + [88, 9], [6] + v + [7] + v + [8, 9, 10], [11, 12, 13, 14]]
    images = [
        [kit.image(90, 60, seed=51)],
        [kit.image(56, 112, seed=52), kit.image(150, 100, "RGBA", seed=53)],
        None,
    ]
    return prompts, images


@pytest.mark.parametrize("family", list(FAMILIES))
def test_mixed_batch_on_cpu(kit, request, family) -> None:
    checkpoint, engine, preprocessor = FAMILIES[family]
    hf = request.getfixturevalue(checkpoint)[0]
    llm = request.getfixturevalue(engine)
    prompts, images = _mixed_batch(kit)
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)
    outs = llm.generate(prompts, params, images=images)
    for prompt, imgs, out in zip(prompts, images, outs):
        assert list(out.outputs[0].token_ids) == _hf_tokens(
            kit, hf, prompt, imgs or [], preprocessor
        )


@pytest.mark.gpu
@pytest.mark.parametrize("family", list(FAMILIES))
def test_engine_on_cuda_with_graphs(kit, request, family) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from tallow.plugin.testing.engine import offline_llm

    checkpoint, _, preprocessor = FAMILIES[family]
    hf, path = request.getfixturevalue(checkpoint)
    llm = offline_llm(
        str(path),
        plugins=[
            "tallow-model-qwen2-vl",
            "tallow-model-llama",
            "tallow-format-safetensors",
            "tallow-attention-triton",
        ],
        config={
            "model": {"dtype": "float32", "device": "cuda", "max_model_len": 256},
            "cache": {"num_blocks": 64, "block_size": 16},
        },
    )
    assert llm.engine.core.runner.graphs is not None, "expected CUDA graphs for decode steps"
    prompts, images = _mixed_batch(kit)
    params = SamplingParams(temperature=0.0, max_tokens=STEPS, ignore_eos=True)
    outs = llm.generate(prompts, params, images=images)
    for prompt, imgs, out in zip(prompts, images, outs):
        assert list(out.outputs[0].token_ids) == _hf_tokens(
            kit, hf, prompt, imgs or [], preprocessor
        )


@pytest.mark.gpu
@pytest.mark.gpu_alone
def test_seven_b_shape_encodes_a_large_image(kit) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from tallow.plugin.testing.engine import offline_llm

    llm = offline_llm(
        "random:qwen2.5-vl-7b",
        plugins=["tallow-model-qwen2-vl", "tallow-model-llama"],
        config={"model": {"dtype": "bfloat16", "device": "cuda", "max_model_len": 4096}},
    )
    model = llm.engine.images.model
    image = kit.image(1024, 1024, seed=54)
    prompt = [100, 151652, 151655, 151653, 101]
    out = llm.generate(prompt, SamplingParams(max_tokens=2, ignore_eos=True), images=[image])[0]
    assert len(out.prompt_token_ids) == 4 + model.process_image(image).num_tokens
    assert llm.engine.stats()["images_encoded"] == 1
