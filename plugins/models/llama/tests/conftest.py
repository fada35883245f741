"""The helpers of :mod:`tallow.plugin.model_testing`, and loading a saved transformers model into
the tallow class of its architecture, for the test modules (which cannot import conftest by
name)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tallow.plugin.model_testing import (
    PagedRunner, assert_close_logits, load_model, random_hf_model, randomize_,
)


def build_hf(config: Any, path: Path, seed: int = 0) -> Any:
    """A transformers model of ``config`` with random weights, saved as safetensors at ``path``."""
    model = random_hf_model(config, seed)
    model.save_pretrained(str(path), safe_serialization=True)
    return model


def load_tallow(path: Path, dtype: torch.dtype = torch.float32,
                device: str = "cpu") -> tuple[Any, Any]:
    """(model, checkpoint) of the directory through the safetensors format and the registered
    architecture class."""
    from tallow_safetensors.format import SafetensorsFormat

    from tallow_llama import model as llama_models

    fmt = SafetensorsFormat()
    assert fmt.claims(str(path))
    ckpt = fmt.load(str(path))
    cls = getattr(llama_models, ckpt.architecture)
    return load_model(cls, ckpt, dtype=dtype, device=device), ckpt


@pytest.fixture
def kit() -> SimpleNamespace:
    """The helpers above, for test modules (which cannot import conftest by name)."""
    return SimpleNamespace(PagedRunner=PagedRunner, build_hf=build_hf, load_tallow=load_tallow,
                           randomize_=randomize_, assert_close_logits=assert_close_logits)
