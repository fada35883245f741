"""Tiny transformers twins of the Llama-family models, and the kit's helpers to run a tallow
model without the engine (``PagedRunner``: see tallow.plugin.testing)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tallow.layers import BuildContext
from tallow.plugin.testing.model import assert_close_logits
from tallow.plugin.testing.paged_runner import PagedRunner, randomize_


def build_hf(config: Any, path: Path, seed: int = 0) -> Any:
    """A transformers model of ``config`` with random weights, saved as safetensors at ``path``."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(
        config, attn_implementation="eager", dtype=torch.float32
    )
    randomize_(model, seed)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    model.eval()
    model.save_pretrained(str(path), safe_serialization=True)
    return model


def load_tallow(
    path: Path, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> tuple[Any, Any]:
    """(model, checkpoint) of the directory through the safetensors format and the registered
    architecture class."""
    from tallow.layers import ArchConfig
    from tallow_format_safetensors.format import SafetensorsFormat

    from tallow_model_llama import model as llama_models

    fmt = SafetensorsFormat()
    assert fmt.claims(str(path))
    ckpt = fmt.load(str(path))
    cls = getattr(llama_models, ckpt.architecture)
    model = cls(ArchConfig(ckpt.config), BuildContext(dtype=dtype, device=torch.device(device)))
    model.load_weights(ckpt.tensors(), naming=ckpt.naming)
    model.eval()
    return model, ckpt


@pytest.fixture
def kit() -> SimpleNamespace:
    """The helpers above, for test modules (which cannot import conftest by name)."""
    return SimpleNamespace(
        PagedRunner=PagedRunner,
        build_hf=build_hf,
        load_tallow=load_tallow,
        randomize_=randomize_,
        assert_close_logits=assert_close_logits,
    )
