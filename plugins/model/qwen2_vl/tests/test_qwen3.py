"""Qwen3-VL's own parts: the interleaved M-RoPE against transformers' rotary embedding, its
checkpoints in both tensor layouts, bad configs refused naming the key, and its DeepStack
features through the engine's caches (chunk boundaries inside an image, the encoder cache
serving an image seen before)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tallow.engine.sampling.params import SamplingParams
from tallow.layers import ArchConfig, BuildContext, MultimodalStep, multimodal_step

PREFIX = [3 + i for i in range(20)]
SUFFIX = [40, 41, 42, 43, 44]


def test_interleaved_rotary_equals_transformers() -> None:
    """cos and sin of random three-axis positions equal transformers' Qwen3-VL text rotary
    embedding (which interleaves the axes' frequencies)."""
    from transformers import Qwen3VLTextConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

    from tallow_model_qwen2_vl.mrope import InterleavedMRotaryEmbedding

    sections = [16, 24, 24]  # Qwen3-VL-8B's
    config = Qwen3VLTextConfig(
        hidden_size=512,
        num_attention_heads=4,
        head_dim=128,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 5e6,
            "mrope_section": sections,
            "mrope_interleaved": True,
        },
    )
    ref = Qwen3VLTextRotaryEmbedding(config)
    ours = InterleavedMRotaryEmbedding(128, sections, 4096, 5e6)
    torch.manual_seed(0)
    axes = torch.randint(0, 4000, (3, 37))
    ref_cos, ref_sin = ref(torch.zeros(1, dtype=torch.float32), axes[:, None, :])
    with multimodal_step(MultimodalStep(positions=axes)):
        cos, sin = ours.cos_sin(axes[0], torch.float32)
    # transformers repeats the 64 frequencies twice over the head; ours keeps one half
    torch.testing.assert_close(cos, ref_cos[0, :, :64], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sin, ref_sin[0, :, :64], atol=1e-5, rtol=1e-5)
    # consecutive sections would differ: the interleaving is what is tested
    plain = ours.cos_sin_cache[axes]
    assert not torch.allclose(
        cos, torch.cat([plain[0, :, :16], plain[1, :, 16:40], plain[2, :, 40:64]], -1), atol=1e-3
    )


@pytest.mark.parametrize("layout", ["transformers-5", "original"])
def test_both_tensor_layouts_load_every_parameter(qwen3_checkpoint, layout) -> None:
    from tallow.plugin.testing.model import load_checkpoint_dir

    from tallow_model_qwen2_vl.model import Qwen3VLForConditionalGeneration

    config, tensors = load_checkpoint_dir(qwen3_checkpoint[1])
    if layout == "original":
        tensors = {
            n.replace("model.visual.", "visual.", 1).replace(
                "model.language_model.", "model.", 1
            ): t
            for n, t in tensors.items()
        }
    model = Qwen3VLForConditionalGeneration(ArchConfig(config), BuildContext())
    filled = model.load_weights(iter(tensors.items()), naming="hf")
    assert {n for n, _ in model.named_parameters()} <= filled
    visual = qwen3_checkpoint[0].model.visual
    assert torch.equal(model.visual.pos_embed, visual.pos_embed.weight)
    assert torch.equal(
        model.visual.deepstack_merger_list[1].norm.weight,
        visual.deepstack_merger_list[1].norm.weight,
    )


def test_bad_configs_name_the_key(qwen3_checkpoint) -> None:
    from tallow.plugin.testing.model import load_checkpoint_dir

    from tallow_model_qwen2_vl.model import Qwen3VLForConditionalGeneration

    config, _ = load_checkpoint_dir(qwen3_checkpoint[1])
    vision = config["vision_config"]
    for bad, message in (
        (dict(vision, num_position_embeddings=15), "15 is not a square"),
        (dict(vision, deepstack_visual_indexes=[0, 3]), r"deepstack_visual_indexes \[3\]"),
        (
            {k: v for k, v in vision.items() if k != "num_position_embeddings"},
            "vision_config.num_position_embeddings is required",
        ),
    ):
        with pytest.raises(ValueError, match=message):
            Qwen3VLForConditionalGeneration(
                ArchConfig(dict(config, vision_config=bad)), BuildContext()
            )


def _prompt(kit: Any, prefix: list[int] = PREFIX) -> list[int]:
    return prefix + [kit.VISION_START, kit.IMAGE_TOKEN, kit.VISION_END] + SUFFIX


def _engine(
    path: Any, cache: dict[str, Any] | None = None, scheduler: dict[str, Any] | None = None
) -> Any:
    from tallow.plugin.testing.engine import offline_llm

    return offline_llm(
        str(path),
        plugins=["tallow-model-qwen2-vl", "tallow-model-llama", "tallow-format-safetensors"],
        config={
            "model": {"dtype": "float32", "max_model_len": 256},
            "cache": {"num_blocks": 64, "block_size": 16, **(cache or {})},
            "scheduler": scheduler or {},
        },
    )


def test_chunk_boundaries_inside_an_image(kit, qwen3_checkpoint, qwen3_llm) -> None:
    """Chunks of 7 tokens cut the image's tokens (and their DeepStack features) several
    times: same tokens and prompt logprobs as one whole prefill."""
    chunked = _engine(
        qwen3_checkpoint[1], {"enable_prefix_caching": False}, {"prefill_chunk_size": 7}
    )
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, prompt_logprobs=0)
    image = kit.image(200, 140, seed=21)
    whole = qwen3_llm.generate(_prompt(kit), params, images=[image])[0]
    parts = chunked.generate(_prompt(kit), params, images=[image])[0]
    assert list(parts.outputs[0].token_ids) == list(whole.outputs[0].token_ids)
    for p in range(1, len(whole.prompt_token_ids)):
        tok = whole.prompt_token_ids[p]
        assert parts.prompt_logprobs[p][tok].logprob == pytest.approx(
            whole.prompt_logprobs[p][tok].logprob, abs=1e-4
        )
    assert chunked.engine.stats()["images_encoded"] == 1


def test_encoder_cache_serves_the_deepstack_features(kit, qwen3_checkpoint) -> None:
    """An image seen before after another text (no prefix block shared) is served from the
    encoder cache and gives the tokens of a fresh engine."""
    llm = _engine(qwen3_checkpoint[1])
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    image = kit.image(200, 140, seed=11)
    llm.generate(_prompt(kit), params, images=[image])
    moved = llm.generate(_prompt(kit, [7] * 20), params, images=[image])[0]
    stats = llm.engine.stats()
    assert stats["images_encoded"] == 1 and stats["encoder_cache_hits"] == 1
    assert moved.num_cached_tokens == 0
    fresh = _engine(qwen3_checkpoint[1]).generate(_prompt(kit, [7] * 20), params, images=[image])[0]
    assert list(moved.outputs[0].token_ids) == list(fresh.outputs[0].token_ids)
