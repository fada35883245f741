"""Gemma 3 with its vision tower against transformers' Gemma3ForConditionalGeneration on the same
random weights, through the whole engine (``LLM.generate`` with images): the log-probabilities
of the prompt's text after the images, and 32 greedy tokens, with one and with two images.

The tiny config makes the parts that differ from a text model matter: 6 × 6 patches pooled
2 × 2 into 9 image tokens, and a sliding window of 6 on the first layer, shorter than an image,
so the bidirectional attention inside an image meets the window."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers is the parity oracle")

from tallow.engine.sampling.params import SamplingParams  # noqa: E402

VOCAB, BOI, EOI, IMAGE, NL = 300, 297, 298, 299, 108
TOKENS_PER_IMAGE = 9
IMAGE_SIZE = 84
STEPS = 32


def hf_config() -> Any:
    text = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=VOCAB,
        sliding_window=6,
        layer_types=["sliding_attention", "full_attention"],
        query_pre_attn_scalar=16,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    vision = dict(
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIZE,
        patch_size=14,
        vision_use_head=False,
    )
    return transformers.Gemma3Config(
        text_config=text,
        vision_config=vision,
        mm_tokens_per_image=TOKENS_PER_IMAGE,
        image_token_index=IMAGE,
        boi_token_index=BOI,
        eoi_token_index=EOI,
    )


def image(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Any:
    from PIL import Image

    rng = np.random.default_rng(seed)
    rgb = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")
    return rgb if mode == "RGB" else rgb.convert(mode)


def preprocessor() -> dict[str, Any]:
    return {
        "image_processor_type": "Gemma3ImageProcessor",
        "size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        "do_pan_and_scan": False,
    }


#: Gemma 3's way of rendering image parts (``<start_of_image>``), on a template reduced to the
#: messages' content
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for c in m['content'] %}{% if c['type'] == 'image' %} <start_of_image> "
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{% endfor %}"
)


def save_tokenizer(path: Path) -> None:
    """A word-level tokenizer (``w<id>``) whose ids 297..299 are Gemma 3's image tokens
    (special), and a chat template that renders image parts as Gemma 3's does."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    names = {BOI: "<start_of_image>", EOI: "<end_of_image>", IMAGE: "<image_soft_token>"}
    vocab = {names.get(i, f"w{i}"): i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    tok.add_special_tokens([AddedToken(n, special=True) for n in names.values()])
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"add_bos_token": False, "eos_token": "w1", "chat_template": CHAT_TEMPLATE})
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    from tallow.plugin.testing.paged_runner import randomize_

    path = tmp_path_factory.mktemp("gemma3_vision")
    torch.manual_seed(0)
    hf = transformers.Gemma3ForConditionalGeneration._from_config(
        hf_config(), attn_implementation="eager", dtype=torch.float32
    )
    randomize_(hf, 5, 0.15)
    hf.eval()
    hf.save_pretrained(str(path), safe_serialization=True)
    save_tokenizer(path)
    (path / "preprocessor_config.json").write_text(json.dumps(preprocessor()))
    return hf, path


@pytest.fixture(scope="module")
def llm(checkpoint: tuple[Any, Path]) -> Any:
    from tallow.plugin.testing.engine import offline_llm

    return offline_llm(
        str(checkpoint[1]),
        plugins=["tallow-model-gemma", "tallow-format-safetensors"],
        config={
            "model": {"dtype": "float32", "max_model_len": 256},
            "cache": {"num_blocks": 64, "block_size": 16},
            "scheduler": {"max_num_batched_tokens": 256},
        },
    )


def _prompt(text_parts: list[list[int]]) -> list[int]:
    """Text pieces with one begin-of-image placeholder between consecutive pieces."""
    out = list(text_parts[0])
    for piece in text_parts[1:]:
        out += [BOI] + list(piece)
    return out


def _hf_inputs(prompt: list[int], images: list[Any]) -> dict[str, torch.Tensor]:
    """transformers' inputs: each begin-of-image expanded as Gemma3Processor's
    ``full_image_sequence`` ("\\n\\n", begin, image tokens, end, "\\n\\n")."""
    from transformers import Gemma3ImageProcessorPil

    settings = {k: v for k, v in preprocessor().items() if k != "image_processor_type"}
    pixels = Gemma3ImageProcessorPil(**settings)(images=images, return_tensors="pt")
    ids: list[int] = []
    for t in prompt:
        ids += [NL, BOI] + [IMAGE] * TOKENS_PER_IMAGE + [EOI, NL] if t == BOI else [t]
    input_ids = torch.tensor([ids])
    return {
        "input_ids": input_ids,
        "attention_mask": torch.ones_like(input_ids),
        "pixel_values": pixels["pixel_values"],
        "token_type_ids": (input_ids == IMAGE).long(),
    }


def _check(llm: Any, hf: Any, prompt: list[int], images: list[Any]) -> None:
    inputs = _hf_inputs(prompt, images)
    with torch.no_grad():
        ref_logits = hf(**inputs).logits[0].float()
        ref = hf.generate(
            **inputs,
            max_new_tokens=STEPS,
            min_new_tokens=STEPS,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )
    ref_tokens = ref[0, inputs["input_ids"].shape[1] :].tolist()
    ref_lp = torch.log_softmax(ref_logits, -1)

    params = SamplingParams(
        temperature=0.0, max_tokens=STEPS, ignore_eos=True, prompt_logprobs=0, logprobs=0
    )
    out = llm.generate(prompt, params, images=images)[0]
    ids = inputs["input_ids"][0].tolist()
    assert list(out.prompt_token_ids) == ids, "the engine expanded the images differently"
    last_image = max(i for i, t in enumerate(ids) if t == IMAGE)
    # every token after the last image token: the logprob of the token given its prefix
    for p in range(last_image + 1, len(ids)):
        ours = out.prompt_logprobs[p][ids[p]].logprob
        assert ours == pytest.approx(float(ref_lp[p - 1, ids[p]]), abs=2e-4), f"position {p}"
    assert list(out.outputs[0].token_ids) == ref_tokens
    assert len(set(ref_tokens)) > 1, "degenerate model: greedy decoding repeats one token"


def test_one_image(checkpoint, llm) -> None:
    _check(
        llm,
        checkpoint[0],
        _prompt([[5, 17, 40], [88, 120, 9, 64, 33, 12]]),
        [image(90, 60, seed=1)],
    )


def test_two_images(checkpoint, llm) -> None:
    _check(
        llm,
        checkpoint[0],
        _prompt([[5, 17], [88, 120, 9], [64, 33, 12, 200, 7]]),
        [image(56, 112, seed=2), image(150, 100, "RGBA", seed=3)],
    )


def test_bidirectional_image_attention_matters(checkpoint) -> None:
    """The oracle's own logits differ without ``token_type_ids`` (a causal mask over the image):
    the parity above depends on the bidirectional block."""
    hf = checkpoint[0]
    inputs = _hf_inputs(_prompt([[5, 17, 40], [88, 120, 9]]), [image(90, 60, seed=1)])
    causal = {k: v for k, v in inputs.items() if k != "token_type_ids"}
    with torch.no_grad():
        a, b = hf(**inputs).logits, hf(**causal).logits
    assert (a[0, -1] - b[0, -1]).abs().max() > 1e-3


def test_images_change_the_output(llm) -> None:
    """The same prompt with another image gives other logits (the tower is not ignored)."""
    prompt = _prompt([[5, 17, 40], [88, 120, 9, 64]])
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, prompt_logprobs=0)
    a = llm.generate(prompt, params, images=[image(90, 60, seed=1)])[0]
    b = llm.generate(prompt, params, images=[image(90, 60, seed=9)])[0]
    last = len(a.prompt_token_ids) - 1
    tok = a.prompt_token_ids[last]
    assert a.prompt_logprobs[last][tok].logprob != pytest.approx(
        b.prompt_logprobs[last][tok].logprob, abs=1e-4
    )


def test_text_only_prompt(checkpoint, llm) -> None:
    """The same model serves prompts without images as its text model."""
    hf = checkpoint[0]
    prompt = [5, 17, 40, 88, 120, 9, 64, 33]
    with torch.no_grad():
        ref = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=8,
            min_new_tokens=8,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    assert list(llm.generate(prompt, params)[0].outputs[0].token_ids) == ref[0, 8:].tolist()


def _small_step_llm(path: Path, tokens: int) -> Any:
    from tallow.plugin.testing.engine import offline_llm

    return offline_llm(
        str(path),
        plugins=["tallow-model-gemma", "tallow-format-safetensors"],
        config={
            "model": {"dtype": "float32", "max_model_len": 128},
            "cache": {"num_blocks": 64, "block_size": 4},
            "scheduler": {"max_num_batched_tokens": tokens},
        },
    )


def test_chunked_prefill_keeps_images_whole(checkpoint) -> None:
    """Steps of 16 tokens: the image (prompt tokens 12..20) would be cut at 16; the scheduler
    ends that chunk before the image instead, and the result is still transformers'."""
    llm = _small_step_llm(checkpoint[1], 16)
    prompt = _prompt([[5, 17, 40, 41, 42, 43, 44, 45, 46, 47], [88, 120, 9, 64, 33, 12]])
    _check(llm, checkpoint[0], prompt, [image(90, 60, seed=1)])


def test_image_larger_than_a_step_is_refused(checkpoint) -> None:
    from tallow.engine.errors import AdmissionError

    llm = _small_step_llm(checkpoint[1], 8)
    params = SamplingParams(temperature=0.0, max_tokens=2)
    with pytest.raises(AdmissionError, match="image of 9 tokens does not fit one step of 8"):
        llm.generate(_prompt([[5], [6]]), params, images=[image(90, 60, seed=1)])


def test_chat_with_an_image_url_part(llm) -> None:
    """``LLM.chat``: the template renders the image part as ``<start_of_image>``, which the
    engine expands; the same tokens as ``LLM.generate`` with the placeholder id."""
    import base64
    import io

    img = image(80, 120, seed=41)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "w5 w6"},
                {"type": "image_url", "image_url": {"url": url}},
                {"type": "text", "text": "w7 w8"},
            ],
        }
    ]
    out = llm.chat(messages, params)[0]
    ref = llm.generate([5, 6, BOI, 7, 8], params, images=[img])[0]
    assert list(out.prompt_token_ids) == list(ref.prompt_token_ids)
    assert list(out.prompt_token_ids).count(IMAGE) == TOKENS_PER_IMAGE
    assert out.outputs[0].token_ids == ref.outputs[0].token_ids
