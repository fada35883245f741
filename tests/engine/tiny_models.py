"""Tiny random checkpoints (config + safetensors + a trained byte-level BPE tokenizer) that
transformers and tallow both load: the oracle setup of the engine tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Paged attention stores keys and values in fixed-size blocks.",
    "Continuous batching lets new requests join a running batch.",
    "日本語のテキストと emoji 🙂 and accents: café, naïve, über.",
    "for i in range(10):\n\tprint(i * i)\n",
] * 20


def train_tokenizer(vocab_size: int = 320) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|eos|>", "<|bos|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def save_tiny(path: Path, model_type: str = "llama", **overrides: Any) -> Path:
    """Save a tiny random model of ``model_type`` with its tokenizer under ``path``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tok = train_tokenizer()
    vocab = tok.get_vocab_size()
    base = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        eos_token_id=0,
        bos_token_id=1,
        tie_word_embeddings=False,
    )
    base.update(overrides)
    config = AutoConfig.for_model(model_type, **base)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)
    with torch.no_grad():  # larger weights than the default init: less flat distributions
        for p in model.parameters():
            if p.dim() in (2, 3):  # 3: the stacked experts of mixture-of-experts models
                p.normal_(0, 0.2)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "eos_token": "<|eos|>",
                "bos_token": "<|bos|>",
                "add_bos_token": False,
                "chat_template": "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
                "{% if add_generation_prompt %}<assistant>{% endif %}",
            }
        )
    )
    return path
