"""Tiny random transformers encoders saved as model directories that tallow loads, and the
kit's helpers to run a tallow model without the engine."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tallow.plugin.testing.paged_runner import PagedRunner, randomize_

VOCAB = 120


def write_tokenizer(path: Path, vocab_size: int = VOCAB) -> None:
    """A word-level tokenizer (token ``i`` is ``w<i>``) with BERT's [CLS] ... [SEP] frame, so
    that the engine has one; tests pass token ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {f"w{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(
        single="w2 $A w3", special_tokens=[("w2", 2), ("w3", 3)]
    )
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"pad_token": "w0"}))


def build_hf(config: Any, path: Path, seed: int = 0) -> Any:
    """A transformers encoder of ``config`` with random weights, saved as safetensors (with a
    tokenizer) at ``path``."""
    from transformers import AutoModel

    torch.manual_seed(seed)
    model = AutoModel.from_config(
        config, attn_implementation="eager", dtype=torch.float32, add_pooling_layer=False
    )
    randomize_(model, seed)
    model.eval()
    model.save_pretrained(str(path), safe_serialization=True)
    write_tokenizer(path, config.vocab_size)
    return model


def load_tallow(path: Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> Any:
    """The tallow model of the directory, through the safetensors format."""
    from tallow.layers import ArchConfig, BuildContext
    from tallow_format_safetensors.format import SafetensorsFormat

    from tallow_model_bert import model as bert_models

    ckpt = SafetensorsFormat().load(str(path))
    cls = getattr(bert_models, ckpt.architecture)
    model = cls(
        ArchConfig(ckpt.config),
        BuildContext(dtype=dtype, device=torch.device(device), task="embed"),
    )
    model.load_weights(ckpt.tensors(), naming=ckpt.naming)
    return model.eval()


@pytest.fixture
def kit() -> SimpleNamespace:
    """The helpers above, for test modules (which cannot import conftest by name)."""
    return SimpleNamespace(
        build_hf=build_hf,
        load_tallow=load_tallow,
        write_tokenizer=write_tokenizer,
        runner=lambda model: PagedRunner(model, block_size=4, blocks_per_seq=16, max_seqs=4),
    )
