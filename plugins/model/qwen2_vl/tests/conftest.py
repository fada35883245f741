"""Tiny random Qwen2.5-VL, Qwen2-VL and Qwen3-VL models saved by transformers (the oracle), with a
synthetic tokenizer and a preprocessor config that keeps images small, and images of varied
sizes and modes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

VOCAB = 300
IMAGE_TOKEN, VISION_START, VISION_END = 290, 291, 292
PREPROCESSOR = {
    "min_pixels": 28 * 28 * 4,
    "max_pixels": 28 * 28 * 36,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_processor_type": "Qwen2VLImageProcessor",
}
#: Qwen3-VL's form: 16-pixel patches, limits as ``size``, mean and std 0.5
PREPROCESSOR3 = {
    "size": {"shortest_edge": 32 * 32 * 4, "longest_edge": 32 * 32 * 36},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "image_processor_type": "Qwen2VLImageProcessorFast",
}


def qwen3_hf_config() -> Any:
    """Qwen3-VL: Qwen3 text model (q/k norms, interleaved M-RoPE), a tower with a learned
    4 x 4 position table and DeepStack features from two blocks into two of three layers."""
    text = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=VOCAB,
        rms_norm_eps=1e-6,
        max_position_embeddings=512,
        rope_parameters={
            "rope_type": "default",
            "mrope_section": [2, 3, 3],
            "mrope_interleaved": True,
            "rope_theta": 10000.0,
        },
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    vision = dict(
        depth=3,
        hidden_size=32,
        intermediate_size=48,
        num_heads=2,
        out_hidden_size=64,
        num_position_embeddings=16,
        deepstack_visual_indexes=[0, 2],
        patch_size=16,
        spatial_merge_size=2,
        temporal_patch_size=2,
    )
    return transformers.Qwen3VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=IMAGE_TOKEN,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
        video_token_id=293,
        tie_word_embeddings=False,
    )


def qwen2_hf_config() -> Any:
    """Qwen2-VL (first generation): LayerNorm vision blocks, full attention, fc1/fc2 MLPs."""
    text = hf_config().text_config.to_dict()
    vision = dict(
        depth=2,
        embed_dim=32,
        hidden_size=64,
        mlp_ratio=2,
        num_heads=2,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
    )
    return transformers.Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=IMAGE_TOKEN,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
        video_token_id=293,
        tie_word_embeddings=False,
    )


def hf_config() -> Any:
    text = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        rms_norm_eps=1e-6,
        max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    vision = dict(
        depth=3,
        hidden_size=32,
        intermediate_size=48,
        num_heads=2,
        out_hidden_size=64,
        fullatt_block_indexes=[1],
        window_size=56,
        patch_size=14,
        spatial_merge_size=2,
        temporal_patch_size=2,
    )
    return transformers.Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=IMAGE_TOKEN,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
        video_token_id=293,
        tie_word_embeddings=False,
    )


#: Qwen2.5-VL's way of rendering image parts, on a template reduced to the messages' content
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'image' or 'image' in c "
    "or 'image_url' in c %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% endfor %}"
)


def save_tokenizer(path: Path) -> None:
    """A word-level tokenizer whose ids 290..292 are the vision tokens (special), and a chat
    template that renders image parts as Qwen2.5-VL's does."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    names = {
        IMAGE_TOKEN: "<|image_pad|>",
        VISION_START: "<|vision_start|>",
        VISION_END: "<|vision_end|>",
    }
    vocab = {names.get(i, f"w{i}"): i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.add_special_tokens([AddedToken(n, special=True) for n in names.values()])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"add_bos_token": False, "eos_token": "w1", "chat_template": CHAT_TEMPLATE})
    )


def image(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Any:
    from PIL import Image

    rng = np.random.default_rng(seed)
    rgb = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")
    if mode == "RGB":
        return rgb
    if mode == "P":
        return rgb.convert("P", palette=Image.Palette.ADAPTIVE)
    return rgb.convert(mode)


def _save(model: Any, path: Path, preprocessor: dict[str, Any] = PREPROCESSOR) -> tuple[Any, Path]:
    """(``model`` with random weights, the directory it is saved in with tokenizer and
    processor)."""
    from tallow.plugin.testing.paged_runner import randomize_

    model = model.to(torch.float32)
    randomize_(model, 5, 0.15)
    model.eval()
    model.save_pretrained(str(path), safe_serialization=True)
    save_tokenizer(path)
    (path / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    return model, path


def _llm(path: Path) -> Any:
    from tallow.plugin.testing.engine import offline_llm

    return offline_llm(
        str(path),
        plugins=["tallow-model-qwen2-vl", "tallow-model-llama", "tallow-format-safetensors"],
        config={
            "model": {"dtype": "float32", "max_model_len": 256},
            "cache": {"num_blocks": 64, "block_size": 16},
            "scheduler": {"max_num_batched_tokens": 256},
        },
    )


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """(the transformers Qwen2.5-VL, the directory it is saved in with tokenizer and
    processor)."""
    torch.manual_seed(0)
    return _save(
        transformers.Qwen2_5_VLForConditionalGeneration(hf_config()),
        tmp_path_factory.mktemp("qwen2_5_vl"),
    )


@pytest.fixture(scope="session")
def llm(checkpoint: tuple[Any, Path]) -> Any:
    return _llm(checkpoint[1])


@pytest.fixture(scope="session")
def qwen2_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """The same for Qwen2-VL."""
    torch.manual_seed(0)
    return _save(
        transformers.Qwen2VLForConditionalGeneration(qwen2_hf_config()),
        tmp_path_factory.mktemp("qwen2_vl"),
    )


@pytest.fixture(scope="session")
def qwen2_llm(qwen2_checkpoint: tuple[Any, Path]) -> Any:
    return _llm(qwen2_checkpoint[1])


@pytest.fixture(scope="session")
def qwen3_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    """The same for Qwen3-VL."""
    torch.manual_seed(0)
    return _save(
        transformers.Qwen3VLForConditionalGeneration(qwen3_hf_config()),
        tmp_path_factory.mktemp("qwen3_vl"),
        PREPROCESSOR3,
    )


@pytest.fixture(scope="session")
def qwen3_llm(qwen3_checkpoint: tuple[Any, Path]) -> Any:
    return _llm(qwen3_checkpoint[1])


@pytest.fixture(scope="session")
def kit() -> Any:
    """The constants and helpers above, for test modules (which cannot import conftest)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        IMAGE_TOKEN=IMAGE_TOKEN,
        VISION_START=VISION_START,
        VISION_END=VISION_END,
        PREPROCESSOR=PREPROCESSOR,
        PREPROCESSOR3=PREPROCESSOR3,
        image=image,
        hf_config=hf_config,
    )
